"""The one reading of a child's exit status (``corral.children.exits``): workers, the Ray bridge, fetch children."""

from __future__ import annotations

import signal

from corral.children.exits import describe_exit


def test_exit_status_in_words() -> None:
    assert describe_exit(None) == "exited (status unknown)"
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM (signal 15)"
    assert describe_exit(-signal.SIGKILL).startswith("killed by SIGKILL (signal 9): possibly out of memory")
    assert describe_exit(-signal.SIGKILL, detail=False) == "killed by SIGKILL"
