"""Embeddings and reranking: the embedder (``embedder``) and its own context (``context``).
"""
