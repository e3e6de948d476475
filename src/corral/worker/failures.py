"""The one exception the engine uses to refuse a request (answered as RequestFailed)."""

from __future__ import annotations

from corral import wire

__all__ = ["RequestRejected"]


class RequestRejected(Exception):
    def __init__(self, code: wire.FailureCode, message: str) -> None:
        super().__init__(message)
        self.code: wire.FailureCode = code
        self.message = message
