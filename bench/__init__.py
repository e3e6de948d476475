"""corral's benchmarks, run from the repository root: ``python -m bench.run`` (see bench/README.md)."""
