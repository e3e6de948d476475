"""The worker: one process per model instance, a continuous-batching engine on llama.cpp."""
