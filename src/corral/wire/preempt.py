"""The wire frames of fair-share preemption (docs/internals/fair-share.md, "Preemption").
Part of ``corral.wire`` (which re-exports them; import them from there). Imports nothing
of corral.

    router                                   worker
      | --------------- Preempt(id) ------> |   pause between decode steps
      | <--- Paused(id, paused, kept_kv) -- |   its slot is free (paused False: it could
      |                                     |   not be paused: unknown, ended, not generating)
      | --------------- Resume(id) -------> |   it continues where it stopped (same worker)
      | <--- Delta* then Finished --------- |

An Abort of a paused request is answered by Finished(abort), as for a running one."""

from __future__ import annotations

import msgspec

__all__ = ["Preempt", "Resume", "Paused"]


class Preempt(msgspec.Struct, frozen=True, tag="preempt"):
    """Pause request ``id`` at the next step boundary and free its slot."""

    id: str


class Resume(msgspec.Struct, frozen=True, tag="resume"):
    """Continue the paused request ``id`` in a free slot (the router reserved one)."""

    id: str


class Paused(msgspec.Struct, frozen=True, tag="paused", kw_only=True):
    """The answer to ``Preempt``. ``paused``: it is paused and its slot is free (False:
    nothing was paused, and no slot freed). ``kept_kv``: its KV state is kept in the
    worker's host-RAM store (False: it is recomputed on resume); ``n_tokens``: the
    tokens (prompt + generated) whose KV it had; ``state_bytes``: the bytes kept."""

    id: str
    paused: bool
    kept_kv: bool = False
    n_tokens: int = 0
    state_bytes: int = 0
