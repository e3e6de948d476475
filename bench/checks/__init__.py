"""Equality checks against llama-server on the same files (one feature each)."""
