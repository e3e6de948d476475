"""Speculation counters from a worker's Stats: the GET /models view and the /metrics gauges."""

from __future__ import annotations

from corral import wire
from corral.control.metrics import Metrics
from corral.control.views import speculation


def _stats(**kw: int) -> wire.Stats:
    base = dict(slots_busy=0, slots_total=4, waiting=0, rss_bytes=1, model_bytes=1, kv_bytes=1,
                tokens_generated=300, tokens_prompt=10)
    base.update(kw)
    return wire.Stats(**base)  # type: ignore[arg-type]


def test_speculation_view_reports_rates() -> None:
    v = speculation(_stats(spec_drafted=200, spec_accepted=150, gen_steps=120))
    assert v == {"draft_tokens": 200, "accepted_tokens": 150, "acceptance_rate": 0.75, "tokens_per_step": 2.5}
    assert speculation(_stats())["acceptance_rate"] is None  # type: ignore[index]
    assert speculation(None) is None


def test_metrics_expose_the_speculation_gauges() -> None:
    m = Metrics()
    inst = {"index": 0, "state": "ready", "busy": 0, "total": 4, "memory": None, "node": "local",
            "node_address": "", "speculation": speculation(_stats(spec_drafted=10, spec_accepted=4, gen_steps=100))}
    m.watch(lambda: [{"id": "m", "status": "loaded", "queued": 0, "instances": [inst]}])
    text = m.render().decode()
    assert 'corral_spec_acceptance_rate{instance="0",model="m",node="local"} 0.4' in text
    assert 'corral_spec_tokens_per_step{instance="0",model="m",node="local"} 3.0' in text
    assert 'corral_spec_draft_tokens{instance="0",model="m",node="local"} 10.0' in text
