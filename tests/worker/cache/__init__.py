"""The prompt cache and the host KV store (src/corral/worker/cache/)."""
