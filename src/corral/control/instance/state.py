"""An instance's states, the transitions allowed between them, and what a transition
reports (``corral.control.instance.instance`` owns the state machine)."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from corral.control.transport.link import LinkExit, Placement

log = logging.getLogger("corral.instance")

__all__ = ["InstanceState", "ALLOWED", "Timeouts", "Transition", "failure_reason", "status_fields"]


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


def failure_reason(model: str, exit: LinkExit, load_error: str | None, *, loading: bool, log_tail: str) -> str:
    """Why an instance failed, in words: the load error the worker (or a timeout) gave, else
    how it exited. Clients see it (a load's 503), so never the worker's log: its last lines,
    which may hold a traceback and paths, go to the router's log."""
    if load_error is not None:
        reason = load_error
    else:
        reason = f"worker died while loading: {exit.reason}" if loading else exit.reason
    tail = "\n".join(ln for ln in log_tail.splitlines() if reason not in ln)
    log.warning("%s failed: %s%s", model, reason, f"; the worker's last log lines:\n{tail}" if tail else "")
    return reason


def status_fields(index: int, old: InstanceState, new: InstanceState, pid: int | None, placement: Placement,
                  reason: str | None, exit_code: int | None) -> dict[str, object]:
    """The fields of a ``status_change`` event."""
    fields: dict[str, object] = {"instance": index, "old": old.value, "new": new.value, "pid": pid}
    if reason is not None:
        fields["reason"] = reason
    if exit_code is not None:
        fields["exit_code"] = exit_code
    if placement.node_id is not None:  # where it runs (a Ray node)
        fields["node"] = {"id": placement.node_id, "address": placement.node_address}
    return fields
