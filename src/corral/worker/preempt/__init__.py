"""Fair-share preemption in the worker: pausing and resuming a slot's request (``preemption``), urgent starts (``urgent``); docs/internals/fair-share.md.
"""
