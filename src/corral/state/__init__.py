"""What the server keeps on disk: where (paths.py), and the prompt cache's files (cache_files.py)."""
