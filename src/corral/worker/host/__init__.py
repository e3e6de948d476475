"""The host the worker runs on: its CPU cores (``cpu``: the thread governor), the ggml threadpool (``threadpool``), the devices llama.cpp sees (``devices``).
"""
