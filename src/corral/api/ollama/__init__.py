"""api/ollama"""
