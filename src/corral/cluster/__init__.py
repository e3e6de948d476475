"""Model instances on a Ray cluster: the bridge (Ray driver), the worker-host actor, a local test cluster."""
