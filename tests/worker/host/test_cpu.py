"""ThreadGovernor decisions with scripted CPU counters (no model)."""

from __future__ import annotations

import os
import subprocess
import sys

from corral.worker.host import cpu
from corral.worker.host.cpu import ThreadGovernor, cpu_jiffies

T = cpu._TICK


class Script:
    """Fake clock and counters: others/ours in cores used over each 1 s window."""

    def __init__(self) -> None:
        self.t = 0.0
        self.busy = 0.0
        self.ours = 0.0

    def window(self, others: float, ours: float) -> None:
        self.t += 1.0
        self.busy += (others + ours) * T
        self.ours += ours * T

    def read(self) -> tuple[float, float]:
        return self.busy, self.ours

    def clock(self) -> float:
        return self.t


def make(configured: int, n_cpus: int = 2) -> tuple[ThreadGovernor, Script, list[int]]:
    s = Script()
    applied: list[int] = []
    g = ThreadGovernor(configured, applied.append, n_cpus=n_cpus, read=s.read, clock=s.clock)
    return g, s, applied


def test_drops_to_free_cores_and_comes_back() -> None:
    g, s, applied = make(2)
    s.window(others=0.0, ours=2.0)
    g.tick()
    assert g.current == 2 and applied == []
    s.window(others=1.0, ours=1.0)  # another busy worker
    g.tick()
    assert g.current == 1 and applied == [1]
    s.window(others=1.0, ours=1.0)
    g.tick()
    assert applied == [1]  # stable, no re-apply
    s.window(others=0.1, ours=1.0)  # the other process went idle
    g.tick()
    assert g.current == 2 and applied == [1, 2]


def test_small_background_load_keeps_all_threads() -> None:
    g, s, applied = make(2)
    s.window(others=0.45, ours=1.8)  # router and clients waking per token
    g.tick()
    assert g.current == 2 and applied == []
    s.window(others=0.7, ours=1.5)  # a busy neighbour
    g.tick()
    assert g.current == 1


def test_never_more_than_configured_nor_less_than_one() -> None:
    g, s, applied = make(4, n_cpus=16)
    s.window(others=3.0, ours=4.0)
    g.tick()
    assert g.current == 4 and applied == []
    s.window(others=15.5, ours=0.5)
    g.tick()
    assert g.current == 1


def test_rate_limited() -> None:
    g, s, applied = make(2)
    s.t += 0.1
    s.busy += 1.5 * 0.1 * T  # others at 1.5 cores, but only 0.1 s measured
    g.tick()
    assert applied == []  # too soon to decide
    s.t += 0.4
    s.busy += 1.5 * 0.4 * T
    g.tick()
    assert applied == [1]  # the whole 0.5 s window counts


def test_single_thread_config_disables() -> None:
    g, s, applied = make(1)
    assert not g.enabled
    s.window(others=2.0, ours=1.0)
    g.tick()
    assert applied == []


def test_reads_real_proc_counters() -> None:
    got = cpu_jiffies()
    assert got is not None and got[0] >= got[1] >= 0


def test_wake_restores_threads_when_the_neighbour_went_quiet() -> None:
    """The blind spot: idle next to a busy neighbour, the governor settled on 1 thread;
    the neighbour stops, a request comes: wake() decides from what runs right now."""
    s = Script()
    applied: list[int] = []
    running = [1]
    g = ThreadGovernor(2, applied.append, n_cpus=2, read=s.read, clock=s.clock,
                       running=lambda: running[0])
    s.window(others=1.0, ours=0.0)  # we are idle, a neighbour decodes
    g.tick()
    assert g.current == 1 and applied == [1]
    running[0] = 1  # only our own thread is runnable: the neighbour is done
    g.wake()
    assert g.current == 2 and applied == [1, 2]


def test_wake_never_lowers_the_threads() -> None:
    """At the instant work arrives the router and the client are often running: waking
    must not take threads from a lone model (it did, at every wave of requests). A
    neighbour that really is busy shows in the next window."""
    s = Script()
    applied: list[int] = []
    running = [2]  # ours + the router that just sent the request
    g = ThreadGovernor(2, applied.append, n_cpus=2, read=s.read, clock=s.clock,
                       running=lambda: running[0])
    g.wake()
    assert g.current == 2 and applied == []
    # the next tick measures only the busy spell that followed the wake
    s.window(others=1.0, ours=1.0)
    g.tick()
    assert g.current == 1 and applied == [1]


def test_runnable_threads_reads_proc_stat() -> None:
    n = cpu.runnable_threads()
    if sys.platform == "linux":
        assert n is not None and n >= 1  # this test's own thread is running
    else:
        assert n is None


class NiceScript(Script):
    """Also a nice column: cores used by niced processes over each 1 s window."""

    def __init__(self) -> None:
        super().__init__()
        self.nice = 0.0

    def window_nice(self, others: float, ours: float, niced: float, ours_niced: bool = False) -> None:
        self.t += 1.0
        self.busy += (others + (0.0 if ours_niced else ours)) * T
        self.nice += (niced + (ours if ours_niced else 0.0)) * T
        self.ours += ours * T

    def read3(self) -> tuple[float, float, float]:
        return self.busy, self.ours, self.nice


def test_niced_processes_do_not_take_threads_away() -> None:
    """A niced test suite or build yields its cores to a worker at normal priority."""
    s = NiceScript()
    applied: list[int] = []
    g = ThreadGovernor(2, applied.append, n_cpus=2, read=s.read3, clock=s.clock, niced=False)
    s.window_nice(others=0.0, ours=0.5, niced=1.5)
    g.tick()
    assert g.current == 2 and applied == []
    s.window_nice(others=1.0, ours=1.0, niced=0.0)  # a neighbour at normal priority does
    g.tick()
    assert g.current == 1


def test_a_niced_worker_counts_niced_neighbours() -> None:
    s = NiceScript()
    applied: list[int] = []
    g = ThreadGovernor(2, applied.append, n_cpus=2, read=s.read3, clock=s.clock, niced=True)
    s.window_nice(others=0.0, ours=1.0, niced=1.0, ours_niced=True)
    g.tick()
    assert g.current == 1 and applied == [1]


def test_wake_leaves_out_runnable_niced_threads() -> None:
    """procs_running counts niced threads too; wake() leaves out as many as niced
    processes kept busy lately."""
    s = NiceScript()
    applied: list[int] = []
    running = [3]  # ours + two niced threads
    g = ThreadGovernor(2, applied.append, n_cpus=2, read=s.read3, clock=s.clock, niced=False,
                       running=lambda: running[0])
    for _ in range(3):  # idle next to a niced job that takes both cores
        s.window_nice(others=0.0, ours=0.0, niced=2.0)
        g.tick()
    g.current = 1  # say a window had lowered it
    g.wake()
    assert g.current == 2 and applied == [2]
    running[0] = 4  # a neighbour at normal priority runs as well: no room to take back
    g.current = 1
    g.wake()
    assert g.current == 1 and applied == [2]


def test_the_first_window_after_waking_is_short() -> None:
    """Idle next to a busy neighbour, the governor settled on 1 thread; the neighbour
    stops as our work arrives (its threads still spin at that instant, so waking sees no
    room): the first check of the busy spell comes after 0.1 s, not a whole window."""
    s = Script()
    applied: list[int] = []
    g = ThreadGovernor(2, applied.append, n_cpus=2, read=s.read, clock=s.clock, running=lambda: 2)
    s.window(others=1.0, ours=0.0)
    g.tick()
    assert applied == [1]
    g.wake()
    s.t += 0.1
    s.ours += 2.0 * 0.1 * T  # we alone now
    s.busy += 2.0 * 0.1 * T
    g.tick()
    assert applied == [1, 2]
    s.t += 0.1
    s.busy += 1.0 * 0.1 * T  # windows are whole again after that one
    g.tick()
    assert applied == [1, 2]


def test_wake_leaves_out_the_router_that_hands_over_the_work() -> None:
    s = Script()
    applied: list[int] = []
    g = ThreadGovernor(2, applied.append, n_cpus=2, read=s.read, clock=s.clock,
                       running=lambda: 2, parent_running=lambda: 1)
    s.window(others=1.0, ours=0.0)  # a neighbour was busy while we idled
    g.tick()
    g.wake()  # now only we and our router run
    assert applied == [1, 2]


def test_parent_running_reads_proc() -> None:
    """A child asks about us while we wait blocked on its output (it sees 0 once we are in the
    read), then 200 times while we spin without a blocking call (1 every time)."""
    code = ("import sys, time; from corral.worker.host import cpu\n"
            "end = time.monotonic() + 20\n"
            "while cpu.parent_running() and time.monotonic() < end: pass\n"
            "print(cpu.parent_running(), flush=True); sys.stdin.readline()\n"
            "print(min(cpu.parent_running() for _ in range(200)), flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    blocked = child.stdout.readline()  # we sleep in read() while it looks
    child.stdin.write("go\n")
    child.stdin.flush()
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    spun = b""
    while not spun.endswith(b"\n"):  # runnable the whole time
        try:
            spun += os.read(fd, 16)
        except BlockingIOError:
            pass
    child.wait(30)
    assert (blocked.strip(), spun.decode().strip()) == ("0", "1")
