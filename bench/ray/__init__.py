"""corral on Ray: the local test cluster (tests import it too) and ``python -m bench.ray.run``."""
