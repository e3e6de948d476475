"""corral: a local LLM server for many GGUF models and many users, on llama.cpp."""

__version__ = "0.1.0"
