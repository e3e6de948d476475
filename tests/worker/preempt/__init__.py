"""Pausing, resuming and urgent starts (src/corral/worker/preempt/)."""
