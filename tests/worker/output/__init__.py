"""What a slot emits: UTF-8 decoding, stop strings, tool calls (src/corral/worker/output/)."""
