"""Thinking models: the split and the budget (src/corral/worker/reasoning/)."""
