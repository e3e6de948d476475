"""An instance's states, the transitions allowed between them, and what a transition
reports (``corral.control.instance.instance`` owns the state machine)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from corral.control.transport.link import LinkExit

__all__ = ["InstanceState", "ALLOWED", "Timeouts", "Transition", "failure_reason"]


class InstanceState(str, enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


S = InstanceState
ALLOWED: dict[InstanceState, set[InstanceState]] = {
    S.STOPPED: {S.STARTING},
    S.STARTING: {S.READY, S.STOPPING, S.FAILED},
    S.READY: {S.STOPPING, S.FAILED},
    S.STOPPING: {S.STOPPED},
    S.FAILED: {S.STARTING, S.STOPPED},
}


@dataclass(frozen=True, slots=True)
class Timeouts:
    load_timeout_s: float = 300.0
    stop_grace_s: float = 5.0


@dataclass(frozen=True, slots=True)
class Transition:
    old: InstanceState
    new: InstanceState
    restart: bool = False  # a restart after a failure (starting), or one scheduled (failed)


def failure_reason(exit: LinkExit, load_error: str | None, *, loading: bool, log_tail: str) -> str:
    """Why an instance failed, in words: the load error the worker (or a timeout)
    gave, else how it exited; then the last lines of its log (not repeating the reason)."""
    if load_error is not None:
        reason = load_error
    else:
        reason = f"worker died while loading: {exit.reason}" if loading else exit.reason
    tail = "\n".join(ln for ln in log_tail.splitlines() if reason not in ln)
    return f"{reason}; last log lines:\n{tail}" if tail else reason
