"""What a model is: its settings (settings.py), its id (ids.py), its GGUF header (gguf_header.py), its reasoning format (reasoning_format.py)."""
