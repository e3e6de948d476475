"""KV kept beyond a slot: the host-RAM store of sequence states (``kv_store``), the prompt cache (``prompt_cache``, a step feature) and its files (``disk``), llama-server's slot files (``slot_files``); docs/internals/prompt-cache.md.
"""
