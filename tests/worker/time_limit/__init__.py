"""llama-server's generation time limit (src/corral/worker/time_limit/)."""
