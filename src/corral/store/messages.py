"""Typed messages between the DownloadManager (router side) and a fetch child process.

Separate from ``corral.wire`` (router <-> worker): a different conversation. Same
framing: 4-byte big-endian length + msgpack body of a tagged msgspec struct.

The child reads ``FetchRequest`` and ``Proceed`` on stdin (the request never on its command
line, where every local user could read a pull URL's password) and writes to its stdout
(kept for messages only; anything else it prints goes to stderr):

    manager                                  fetch child
      | ---- spawn, FetchRequest ------------> |
      | <-------- Resolved | Failed ---------- |   (metadata known; nothing written yet)
      | ------------- Proceed -------------->  |   (after dedupe and the free-space check)
      | <------------ Progress* ------------- |   (at most every progress_interval_s)
      | <---------- Finished | Failed -------- |   then the child exits
      |  SIGTERM (cancel) -> the child dies; the partial file stays for a resume
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

from corral.children.frames import FrameDecoder, frame

__all__ = [
    "FetchRequest",
    "Resolved",
    "Proceed",
    "Progress",
    "Finished",
    "Failed",
    "FailureKind",
    "FromFetch",
    "encode",
    "decode_from_fetch",
    "decode_to_fetch",
    "FrameReader",
]

MAX_FRAME = 1 << 20

FailureKind = Literal[
    "invalid",  # the source names no usable file (bad form, no file with that tag)
    "not_found",  # 404: repo or file does not exist (or is private)
    "unauthorized",  # 401/403: gated or private; HF_TOKEN needed
    "network",  # connection dropped / 5xx after retries
    "checksum",  # the bytes are not what the sha256 says
    "disk",  # not enough space, disk full, permission denied
    "busy",  # another process is downloading this very file
    "forbidden",  # the URL (or a redirect) names an address the policy refuses (store/address_policy.py)
    "internal",  # anything else
]


class FetchRequest(msgspec.Struct, frozen=True, kw_only=True, tag="fetch"):
    source: str
    models_dir: str
    sha256: str | None = None
    model_id: str | None = None
    retries: int = 5
    retry_backoff_s: float = 0.5
    progress_interval_s: float = 0.2
    timeout_s: float = 30.0
    # a URL source's address policy (``allow_private_pull_urls``): true, false, or CIDR networks
    allow_private: bool | list[str] = False


class Resolved(msgspec.Struct, frozen=True, tag="resolved", kw_only=True):
    model_id: str
    filename: str
    url: str | None  # None when the file is used from the HF cache
    total: int | None  # bytes; None if the server does not say
    sha256: str | None
    cached_path: str | None = None  # a file already on disk (HF cache): no transfer
    have: int = 0  # bytes already in the partial file
    partial_path: str | None = None  # where the bytes go until verified


class Proceed(msgspec.Struct, frozen=True, tag="proceed"):
    pass


class Progress(msgspec.Struct, frozen=True, tag="progress"):
    done: int
    total: int | None


class Finished(msgspec.Struct, frozen=True, tag="finished", kw_only=True):
    path: str
    sha256: str | None
    size: int


class Failed(msgspec.Struct, frozen=True, tag="failed", kw_only=True):
    kind: FailureKind
    reason: str


FromFetch = Union[Resolved, Progress, Finished, Failed]

_enc = msgspec.msgpack.Encoder()
_from = msgspec.msgpack.Decoder(FromFetch)
_to = msgspec.msgpack.Decoder(Union[FetchRequest, Proceed])


def encode(msg: FromFetch | FetchRequest | Proceed) -> bytes:
    return frame(_enc.encode(msg), MAX_FRAME)


def decode_from_fetch(body: bytes) -> FromFetch:
    return _from.decode(body)


def decode_to_fetch(body: bytes) -> FetchRequest | Proceed:
    return _to.decode(body)


class FrameReader(FrameDecoder):
    """The framing ``corral.wire`` uses too (``corral.children.frames``), with this channel's
    smaller frame limit."""

    def __init__(self) -> None:
        super().__init__(MAX_FRAME)
