"""LoRA adapters, a step feature: an adapter set as data (``state``: ``LoraKey``), the loaded adapters and their turns (``adapters``); docs/internals/lora.md.
"""
