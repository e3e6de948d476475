"""How a child process ended, in words: a worker, the Ray bridge, a download's fetch child.

A leaf module (the standard library only): the control plane and the store both use it.
"""

from __future__ import annotations

import signal

__all__ = ["describe_exit"]


def describe_exit(rc: int | None, *, detail: bool = True) -> str:
    """``rc`` as a subprocess reports it (negative: killed by that signal; None: unknown)
    as a phrase without its subject ("exited with code 3", "killed by SIGTERM (signal 15)").
    ``detail``: with the signal's number and, for SIGKILL, the out-of-memory hint."""
    if rc is None:
        return "exited (status unknown)"
    if rc >= 0:
        return f"exited with code {rc}"
    sig = -rc
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if not detail:
        return f"killed by {name}"
    text = f"killed by {name} (signal {sig})"
    if sig == signal.SIGKILL:
        text += ": possibly out of memory (the kernel OOM killer sends SIGKILL) or killed by an operator"
    return text
