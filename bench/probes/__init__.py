"""Small measurements of one part (a step, a placement, a worker), each run as ``python -m bench.probes.NAME``."""
