"""Fixtures: the router harness over fake workers (tests/support)."""

from support.fixtures import harness  # noqa: F401 - the fixture, shared
