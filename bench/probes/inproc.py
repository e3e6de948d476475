"""One worker engine in this process, as a worker sets it up, for step-level benchmarks
(``bench.probes.batch_cost``, ``bench.probes.sampling_threads step``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral import wire

if TYPE_CHECKING:
    from corral.worker.engine import Engine


def embedded_model() -> str:
    from corral.store.embedded import embedded_model_path

    return str(embedded_model_path())


def open_engine(model: str | None, **settings: Any) -> "Engine":
    """An engine on ``model`` (default: the embedded one) with these ``WorkerSettings``,
    ggml's threads spinning as in a worker (0.2 ms, not 3 ms, after a decode)."""
    from corral.worker.process import _cpu_wait_policy

    s = wire.WorkerSettings(model_id="bench", model_path=model or embedded_model(), **settings)
    _cpu_wait_policy(s)
    from corral.worker.engine import Engine

    return Engine(s)


def bench_params(max_tokens: int, **extra: Any) -> wire.SamplingParams:
    """The bench's sampling (loadgen.SAMPLING), ``ignore_eos``."""
    from bench.clients.loadgen import SAMPLING

    return wire.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=SAMPLING["temperature"],
                               top_p=SAMPLING["top_p"], top_k=SAMPLING["top_k"], min_p=SAMPLING["min_p"], **extra)


def start_streams(e: "Engine", n: int, params: wire.SamplingParams, tag: str, first_prompt: int = 0) -> None:
    """Submit ``n`` requests and step until every one has its first token (the prefill is
    behind them: every later step is a decode of ``n`` sequences)."""
    from bench.clients.loadgen import make_prompt

    for i in range(n):
        e.submit(wire.GenerateRequest(id=f"{tag}-{i}", prompt=make_prompt(first_prompt + i), params=params))
    while any(s.job is not None and s.n_gen == 0 for s in e.slots) or e.waiting:
        e.step()


def stop_streams(e: "Engine") -> None:
    """Abort every request still running and drop the output."""
    for s in e.slots:
        if s.job is not None:
            e.abort(s.job.req.id)
    e.take_output()
