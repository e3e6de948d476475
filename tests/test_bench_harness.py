"""The benchmark harness's own logic (bench/): no real model, no timing assertions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest

from bench import context, report
from bench.clients import loadgen


def test_percentiles() -> None:
    assert loadgen.pct([], 50) is None
    assert loadgen.pct([5.0], 95) == 5.0
    assert loadgen.pct([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert loadgen.pct([float(i) for i in range(101)], 95) == 95.0


def test_summarize_and_combined() -> None:
    rs = [loadgen.RequestResult(ok=True, status=200, ttft_s=0.1, latency_s=1.0, completion_tokens=64),
          loadgen.RequestResult(ok=True, status=200, ttft_s=0.3, latency_s=2.0, completion_tokens=64),
          loadgen.RequestResult(ok=False, status=503, latency_s=0.01, error="HTTP 503: busy")]
    s = loadgen.summarize("x", 2, rs, wall_s=2.0)
    assert (s.ok, s.errors, s.status_5xx, s.completion_tokens) == (2, 1, 1, 128)
    assert s.tok_s == 64.0
    assert s.tokens_per_request == 64.0
    assert s.ttft_p50_ms == pytest.approx(200.0)
    assert s.error_samples == ["HTTP 503: busy"]
    both = loadgen.combined("both", [s, loadgen.summarize("y", 2, rs[:1], wall_s=4.0)])
    assert both.completion_tokens == 192 and both.wall_s == 4.0 and both.tok_s == 48.0


def test_prompts_are_distinct() -> None:
    assert len({loadgen.make_prompt(i) for i in range(1000)}) == 1000


def _sse(chunks: list[dict], done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


async def test_one_request_counts_usage_then_chunks() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        chunks = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}, {"choices": [{"text": ""}]}]
        if body["model"] == "with-usage":
            chunks.append({"choices": [], "usage": {"completion_tokens": 5}})
        return httpx.Response(200, content=_sse(chunks), headers={"content-type": "text/event-stream"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        r1 = await loadgen.one_request(c, "http://x/v1/completions",
                                       loadgen.completion_body("with-usage", 3, 5), 10)
        r2 = await loadgen.one_request(c, "http://x/v1/completions",
                                       loadgen.completion_body("no-usage", 4, 5), 10)
    assert r1.ok and r1.completion_tokens == 5 and r1.ttft_s is not None
    assert r2.ok and r2.completion_tokens == 2
    assert seen[0]["ignore_eos"] is True and seen[0]["stream"] is True and seen[0]["max_tokens"] == 5
    assert seen[0]["prompt"] != seen[1]["prompt"]


async def test_one_request_reports_http_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "queue full"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        r = await loadgen.one_request(c, "http://x/v1/completions", loadgen.completion_body("m", 0, 8), 10)
    assert not r.ok and r.status == 503 and "queue full" in (r.error or "")


def _ctx(tmp_path: Path) -> context.Ctx:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return context.Ctx(argparse.Namespace(quick=True, model=str(model), threads=2))


def test_generated_corral_config_is_valid(tmp_path: Path) -> None:
    from corral.config.file import load_config

    ctx = _ctx(tmp_path)
    path = ctx.corral_config("t", {"gemma-a": ctx.corral_model(8), "gemma-b": ctx.corral_model(8, threads=None)},
                             max_queue=2000, max_loaded_models=2)
    cfg = load_config(path)
    assert cfg.server.max_queue == 2000 and cfg.server.include_default_model is False
    a, b = cfg.model_settings("gemma-a"), cfg.model_settings("gemma-b")
    assert (a.n_parallel, a.ctx_len, a.threads) == (8, 8 * context.SLOT_CTX, 2)
    assert b.threads is None  # left to corral


def test_llama_preset(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    text = context.llama_preset(ctx, {"a": 8, "b": 4}, load_on_startup=False)
    a, b = text.split("[a]")[1].split("[b]")
    assert "np = 8" in a and f"c = {8 * context.SLOT_CTX}" in a
    assert "np = 4" in b and f"c = {4 * context.SLOT_CTX}" in b and "t = 2" in text
    assert text.count(f"model = {ctx.model}") == 2


def test_table_markdown() -> None:
    t = report.Table("T", ["a", "b"], [["1", "2"]], ["note"])
    md = t.markdown()
    assert "| a | b |" in md and "| 1 | 2 |" in md and "- note" in md
    assert report.ratio(150.0, 100.0) == "1.50x" and report.ratio(1.0, None) == "–"


async def test_hard_deadline_cuts_running_requests_and_counts_their_tokens(monkeypatch) -> None:
    import asyncio

    async def slow_stream():
        for _ in range(1000):
            yield b'data: {"choices": [{"text": "x"}]}\n\n'
            await asyncio.sleep(0.01)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=slow_stream(), headers={"content-type": "text/event-stream"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    try:
        r = await loadgen.run_load("http://x", label="slow", model="m", concurrency=2, n_requests=10,
                                   client=client, soft_deadline_s=0.05, hard_deadline_s=0.2)
    finally:
        await client.aclose()
    assert r.cut == 2 and r.errors == 0 and r.ok == 0
    assert r.completion_tokens == r.cut_tokens > 0


def test_repeat_summary_lists_each_runs_ratio() -> None:
    cols = ["server", "c", "tok/s", "vs llama-server"]
    runs = [report.Table("Throughput: x", cols, [["corral", "8", "180", f"0.9{i}x"]]) for i in range(3)]
    s = report.repeat_summary(runs)
    assert s is not None
    assert s.rows == [["Throughput", "corral / 8", "vs llama-server", "0.90x", "0.91x", "0.92x"]]
    assert report.repeat_summary([report.Table("T", ["a"], [["1"]])]) is None


async def test_lean_client_streams_and_times_one_token_requests(tmp_path: Path) -> None:
    """bench/clients/lean_client.py against a real router (fake worker): tokens counted from the
    usage chunk, TTFT set, keep-alive reused across requests; errors reported."""
    from bench.clients.lean_client import LeanLatency, run_load_lean
    from support.harness import Harness

    h = Harness(tmp_path)
    try:
        await h.serve({"m": {"path": str(h.script("m", tokens=["a", "b", "c"]))}})
        raw: list = []
        r = await run_load_lean(h.base_url, label="lean", model="m", concurrency=2, n_requests=5, max_tokens=3,
                                raw=raw)
        assert (r.ok, r.errors, r.completion_tokens) == (5, 0, 15), raw
        assert all(x.ttft_s is not None and x.ttft_s <= x.latency_s for x in raw)
        bad = await run_load_lean(h.base_url, label="bad", model="nope", concurrency=1, n_requests=2)
        assert bad.ok == 0 and bad.errors == 2
        async with LeanLatency(h.base_url, "m") as lean:
            assert 0 < await lean.one("x") < 10_000
            assert 0 < await lean.one("y") < 10_000  # same connection
        async with LeanLatency(h.base_url, "nope") as lean:
            with pytest.raises(RuntimeError, match="404"):
                await lean.one("x")
    finally:
        await h.stop()


def test_in_turn_sums_tokens_and_wall_time_of_rounds() -> None:
    a = loadgen.LoadResult(label="a", concurrency=8, n_requests=2)
    a.ok, a.completion_tokens, a.wall_s = 2, 100, 2.0
    b = loadgen.LoadResult(label="b", concurrency=8, n_requests=2)
    b.ok, b.completion_tokens, b.wall_s = 2, 100, 3.0
    r = loadgen.in_turn("both rounds", [a, b])
    assert (r.completion_tokens, r.wall_s, r.concurrency) == (200, 5.0, 8)
    assert r.tok_s == pytest.approx(40.0)  # combined() would take the longest wall: 200 / 3
