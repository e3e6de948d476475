"""The host's CPUs: the thread governor (src/corral/worker/host/)."""
