"""The operator's files: the config (file.py), how its errors are worded (errors.py), the keys file (keys_file.py)."""
