"""Fixtures of the end-to-end tests: real worker processes, the real model, in the
router tests' harness (same fixture)."""

from support.fixtures import harness  # noqa: F401 - the fixture, shared
