"""The store: models on disk and downloads."""
