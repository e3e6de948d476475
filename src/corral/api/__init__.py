"""The HTTP API (FastAPI): OpenAI, llama.cpp-router and Nitro compatible routes."""
