"""Memory fit: the plans of corral/fit/ and the worker's fit to the host (src/corral/worker/fit.py)."""
