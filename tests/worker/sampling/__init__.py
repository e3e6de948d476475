"""The sampler: constraints, the candidate list, sampling on threads (src/corral/worker/sampling/)."""
