"""Speculative decoding: n-gram, draft model, the draft length rule (src/corral/worker/speculation/)."""
