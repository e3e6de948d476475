"""How a step of the download child ends badly: ``Fail`` (final, with a ``FailureKind``; the
child sends it as ``Failed``) or ``Retryable`` (worth another attempt: network, 429, 5xx).
"""

from __future__ import annotations

from corral.store import messages as m

__all__ = ["Fail", "Retryable"]


class Fail(Exception):
    """Ends the child with a ``Failed`` message."""

    def __init__(self, kind: m.FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Retryable(Exception):
    """A failure worth another attempt (network, 429, 5xx)."""
