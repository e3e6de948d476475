"""Model instances on a Ray cluster: the Ray link and cluster (router side), the bridge (Ray driver) and the worker-host actor."""
