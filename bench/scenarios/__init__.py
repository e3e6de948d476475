"""The scenarios of ``python -m bench.run``, one module per scenario or group."""
