"""The restart policy alone, on a fake clock: crash loops, served workers, backoff, retry."""

from __future__ import annotations

from corral.control.instance.restart import RestartPolicy


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_crash_loop_during_load_gives_up_after_max_restarts() -> None:
    c = Clock()
    p = RestartPolicy(max_restarts=2, backoff_s=1.0, clock=c)
    decisions = [p.on_failure(retryable=True) for _ in range(3)]
    assert [d.restart for d in decisions] == [True, True, False]
    assert [d.delay_s for d in decisions] == [1.0, 2.0, 4.0]
    assert decisions[-1].final and decisions[-1].crash_loop


def test_refused_load_is_final_at_once_and_never_retried_by_requests() -> None:
    c = Clock()
    p = RestartPolicy(max_restarts=3, clock=c)
    d = p.on_failure(retryable=False)
    assert d.final and not d.restart
    c.t += 3600
    assert not p.retry_due()


def test_worker_killed_every_30s_under_load_keeps_coming_back() -> None:
    """The field report: ready spells of 25-27 s, killed, forever. Every crash restarts,
    with a backoff that grows and stays capped."""
    c = Clock()
    p = RestartPolicy(max_restarts=3, backoff_s=1.0, max_backoff_s=30.0, clock=c)
    delays = []
    for spell in [25, 27, 26, 25, 27, 26, 25, 27, 26, 25]:
        p.on_ready()
        c.t += spell
        d = p.on_failure(retryable=True)
        assert d.restart and not d.final and not d.crash_loop
        delays.append(d.delay_s)
        c.t += d.delay_s
    assert delays[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert max(delays) == 30.0 and delays[-1] == 30.0


def test_crash_right_after_ready_counts_as_crash_loop() -> None:
    c = Clock()
    p = RestartPolicy(max_restarts=1, settle_s=10.0, clock=c)
    p.on_ready()
    c.t += 2
    assert p.on_failure(retryable=True).restart
    p.on_ready()
    c.t += 2
    d = p.on_failure(retryable=True)
    assert d.final and d.crash_loop


def test_a_served_spell_starts_the_crash_loop_count_over() -> None:
    c = Clock()
    p = RestartPolicy(max_restarts=1, settle_s=10.0, clock=c)
    assert p.on_failure(retryable=True).restart  # during load: 1 of 1
    p.on_ready()
    c.t += 20  # served for a while
    assert p.on_failure(retryable=True).restart
    assert p.crash_loop == 0
    assert p.on_failure(retryable=True).restart  # during load again: 1 of 1


def test_stable_spell_resets_backoff() -> None:
    c = Clock()
    p = RestartPolicy(max_restarts=5, backoff_s=1.0, stable_s=30.0, clock=c)
    for _ in range(3):
        p.on_failure(retryable=True)
    p.on_ready()
    c.t += 31
    assert p.on_failure(retryable=True).delay_s == 1.0


def test_failed_for_good_may_be_retried_by_a_request_after_its_backoff() -> None:
    c = Clock()
    p = RestartPolicy(max_restarts=0, backoff_s=5.0, clock=c)
    d = p.on_failure(retryable=True)
    assert d.final and d.delay_s == 5.0
    assert not p.retry_due()
    c.t += 5
    assert p.retry_due()
    p.reset()
    assert not p.retry_due() and p.failures == 0
