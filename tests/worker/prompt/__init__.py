"""Chat prompts as templates render them (src/corral/worker/prompt/)."""
