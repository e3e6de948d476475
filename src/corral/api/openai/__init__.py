"""api/openai"""
