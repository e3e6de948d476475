"""LoRA adapters, alone and with the features that keep a slot's cells (src/corral/worker/lora/)."""
