"""Prometheus metrics, one CollectorRegistry per router (so tests can run many apps).

Counters and histograms are updated once per request (never per token); gauges that
describe current state (queue depth, busy slots, loaded models, memory) are read from
the control plane at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Metrics"]

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class _StateCollector:
    def __init__(self, snapshot: Callable[[], Iterable[dict[str, Any]]]) -> None:
        self._snapshot = snapshot

    def collect(self):  # type: ignore[no-untyped-def]  # noqa: ANN202 - prometheus_client's collector protocol is untyped
        queue = GaugeMetricFamily("corral_queue_depth", "Requests waiting for a slot", labels=["model"])
        per_instance = ["model", "instance", "node"]  # node: the Ray node id, "local" on this machine
        busy = GaugeMetricFamily("corral_slots_busy", "Slots running a request", labels=per_instance)
        total = GaugeMetricFamily("corral_slots_total", "Slots of ready instances", labels=per_instance)
        mem = GaugeMetricFamily("corral_instance_memory_bytes", "Weights + KV cache as reported by the worker",
                                labels=per_instance)
        node = GaugeMetricFamily("corral_instance_node", "Where an instance runs (1 per instance)",
                                 labels=[*per_instance, "node_address"])
        spec = {k: GaugeMetricFamily(f"corral_spec_{k}", text, labels=per_instance) for k, text in (
            ("draft_tokens", "Draft tokens verified since the worker started (speculative decoding)"),
            ("accepted_tokens", "Draft tokens accepted since the worker started"),
            ("acceptance_rate", "Accepted / verified draft tokens"),
            ("tokens_per_step", "Tokens emitted per slot and decode step"))}
        cache = {k: GaugeMetricFamily(f"corral_prompt_cache_{k}", text, labels=per_instance) for k, text in (
            ("hits", "Admissions served by a restored prefix since the worker started (RAM or disk)"),
            ("disk_hits", "Of them, read from disk"),
            ("misses", "Admissions that found no longer saved prefix"),
            ("restored_tokens", "Prompt tokens restored instead of prefilled"),
            ("saved_ms", "Estimated prefill time saved (ms), less the restores' time"),
            ("ram_bytes", "Bytes of saved prefixes in host RAM"),
            ("disk_bytes", "Bytes of this model's prompt-cache files on disk"))}
        method = GaugeMetricFamily("corral_spec_method", "1 per instance that speculates, by method (ngram, draft)",
                                   labels=[*per_instance, "method"])
        loaded = GaugeMetricFamily("corral_model_loaded", "1 when the model has a ready instance", labels=["model"])
        pauses = CounterMetricFamily("corral_preemptions", "Sequences paused for a waiting key (fair share)",
                                     labels=["model", "key"])
        paused_s = CounterMetricFamily("corral_preempted_seconds", "Seconds paused sequences waited (ended pauses)",
                                       labels=["model", "key"])
        for m in self._snapshot():
            if (pre := m.get("preemption")) is not None:  # fair-share pauses per key (control/scheduling/preempt.py)
                for key, n in pre.pauses.items():
                    pauses.add_metric([m["id"], key], n)
                    paused_s.add_metric([m["id"], key], pre.paused_s.get(key, 0.0))
            queue.add_metric([m["id"]], m["queued"])
            loaded.add_metric([m["id"]], 1.0 if m["status"] == "loaded" else 0.0)
            for inst in m["instances"]:
                labels = [m["id"], str(inst["index"]), inst["node"]]
                node.add_metric([*labels, inst["node_address"]], 1.0)
                busy.add_metric(labels, inst["busy"])
                total.add_metric(labels, inst["total"] if inst["state"] == "ready" else 0)
                if inst["memory"] is not None:
                    mem.add_metric(labels, inst["memory"])
                for k, value in (inst.get("speculation") or {}).items():
                    if k == "method":
                        if value != "off":
                            method.add_metric([*labels, value], 1.0)
                    elif k in spec and value is not None:
                        spec[k].add_metric(labels, value)
                for k, value in (inst.get("prompt_cache") or {}).items():
                    if k in cache:
                        cache[k].add_metric(labels, value)
        yield from (queue, busy, total, mem, loaded, node, pauses, paused_s, method, *spec.values(), *cache.values())


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("corral_requests", "Requests answered", ["model", "instance", "endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("corral_prompt_tokens", "Prompt tokens processed", ["model", "instance"], registry=r)
        self.completion_tokens = Counter("corral_completion_tokens", "Tokens generated", ["model", "instance"], registry=r)
        self.ttft = Histogram("corral_time_to_first_token_seconds", "Time to first token (router view)",
                              ["model", "instance"], buckets=_LAT_BUCKETS, registry=r)
        self.latency = Histogram("corral_request_duration_seconds", "Request duration (router view)",
                                 ["model", "instance", "endpoint"], buckets=_LAT_BUCKETS, registry=r)
        self.loads = Counter("corral_loads", "Worker loads finished", ["model", "instance"], registry=r)
        self.load_duration = Histogram("corral_load_duration_seconds", "Worker load time",
                                       ["model", "instance"], buckets=_LOAD_BUCKETS, registry=r)
        self.restarts = Counter("corral_restarts", "Worker restarts after a failure", ["model", "instance"], registry=r)
        # per key (corral.control.keys.access): names from the keys file, "api_key", "-" (anonymous)
        self.key_requests = Counter("corral_key_requests", "Requests per key and model", ["key", "model"], registry=r)
        self.key_prompt_tokens = Counter("corral_key_prompt_tokens", "Prompt tokens per key and model",
                                         ["key", "model"], registry=r)
        self.key_completion_tokens = Counter("corral_key_completion_tokens", "Completion tokens per key and model",
                                             ["key", "model"], registry=r)
        self.rate_limited = Counter("corral_rate_limited", "Requests refused by a key's limits",
                                    ["key", "kind"], registry=r)
        self.key_cached_tokens = Counter("corral_key_cached_tokens", "Prompt tokens reused from the KV cache per key "
                                         "and model", ["key", "model"], registry=r)
        self.key_queue_seconds = Counter("corral_key_queue_seconds", "Time requests waited for a slot per key and "
                                         "model", ["key", "model"], registry=r)
        self.key_unavailable = Counter("corral_key_unavailable", "Requests answered 503 (no room, a full queue) per "
                                       "key and model", ["key", "model"], registry=r)
        self.failures = Counter("corral_instance_failures", "Worker failures (crash or failed load)",
                                ["model", "instance"], registry=r)

    def watch(self, snapshot: Callable[[], Iterable[dict[str, Any]]]) -> None:
        self.registry.register(_StateCollector(snapshot))

    def observe_request(self, model: str, instance: int | None, endpoint: str, status: int,
                        *, prompt_tokens: int = 0, completion_tokens: int = 0,
                        ttft_s: float | None = None, latency_s: float | None = None) -> None:
        inst = "-" if instance is None else str(instance)
        self.requests.labels(model, inst, endpoint, str(status)).inc()
        if prompt_tokens:
            self.prompt_tokens.labels(model, inst).inc(prompt_tokens)
        if completion_tokens:
            self.completion_tokens.labels(model, inst).inc(completion_tokens)
        if ttft_s is not None:
            self.ttft.labels(model, inst).observe(ttft_s)
        if latency_s is not None:
            self.latency.labels(model, inst, endpoint).observe(latency_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
