"""Closed-loop load generator for OpenAI-compatible ``/v1/completions`` servers.

The same client code drives every server (corral, llama.cpp's llama-server,
llama-cpp-python's server), so the numbers are comparable.

``c`` clients run concurrently; each sends one request, waits for it to finish,
then takes the next one, until ``n_requests`` have been sent in total. Every
request has a short distinct prompt, ``stream=True``, ``max_tokens`` fixed and
``ignore_eos=True`` so every server generates the same number of tokens.

Measured per request: time to first token (first streamed chunk with text),
total latency, completion tokens (``usage.completion_tokens`` when the server
sends it, else the number of streamed chunks with text). Aggregate tok/s is the
sum of completion tokens divided by the wall time from the first request sent
to the last one finished.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

# Sampling sent explicitly to every server (llama.cpp's defaults), so no server
# gets an easier (e.g. greedy) sampler than another.
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}

_SUBJECTS = [
    "the sea", "a small town", "the moon", "an old library", "a mountain road",
    "the first snow", "a lost key", "a busy kitchen", "a quiet garden", "the last train",
    "a paper boat", "the river", "a clock tower", "an empty stadium", "a red bicycle",
    "the desert at night", "a letter", "a street market", "the harbour", "a lighthouse",
]


def make_prompt(i: int) -> str:
    """A short prompt, distinct for each request index (no cross-request prefix-cache wins)."""
    return f"Story {i}: Once upon a time, near {_SUBJECTS[i % len(_SUBJECTS)]}, there lived"


def pct(values: list[float], q: float) -> float | None:
    """Percentile by linear interpolation (q in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


@dataclass
class RequestResult:
    ok: bool
    status: int | None = None
    ttft_s: float | None = None
    latency_s: float = 0.0
    completion_tokens: int = 0
    error: str | None = None
    cut: bool = False  # cancelled at the load's hard deadline; its tokens so far still count
    t0: float | None = None
    gaps_s: list[float] = field(default_factory=list)  # between a stream's events that carry text


@dataclass
class LoadResult:
    label: str
    concurrency: int
    n_requests: int
    ok: int = 0
    errors: int = 0
    status_5xx: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    tok_s: float = 0.0
    req_s: float = 0.0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    latency_max_ms: float | None = None
    itl_p50_ms: float | None = None  # inter-token latency: gaps between a stream's text events
    itl_p95_ms: float | None = None
    tokens_per_request: float | None = None
    cut: int = 0  # requests stopped at the hard deadline (their streamed tokens are counted)
    cut_tokens: int = 0
    error_samples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(label: str, concurrency: int, results: list[RequestResult], wall_s: float) -> LoadResult:
    cut = [x for x in results if x.cut]
    results = [x for x in results if not x.cut]
    r = LoadResult(label=label, concurrency=concurrency, n_requests=len(results))
    ok = [x for x in results if x.ok]
    r.ok = len(ok)
    r.errors = len(results) - len(ok)
    r.status_5xx = sum(1 for x in results if x.status is not None and x.status >= 500)
    r.cut = len(cut)
    r.cut_tokens = sum(x.completion_tokens for x in cut)
    r.completion_tokens = sum(x.completion_tokens for x in ok) + r.cut_tokens
    r.wall_s = wall_s
    r.tok_s = r.completion_tokens / wall_s if wall_s > 0 else 0.0
    r.req_s = r.ok / wall_s if wall_s > 0 else 0.0
    ttfts = [x.ttft_s * 1000 for x in ok if x.ttft_s is not None]
    lats = [x.latency_s * 1000 for x in ok]
    r.ttft_p50_ms, r.ttft_p95_ms = pct(ttfts, 50), pct(ttfts, 95)
    r.latency_p50_ms, r.latency_p95_ms = pct(lats, 50), pct(lats, 95)
    r.latency_max_ms = max(lats) if lats else None
    gaps = [g * 1000 for x in ok for g in x.gaps_s]
    r.itl_p50_ms, r.itl_p95_ms = pct(gaps, 50), pct(gaps, 95)
    r.tokens_per_request = ((r.completion_tokens - r.cut_tokens) / r.ok) if r.ok else None
    seen: list[str] = []
    for x in results:
        if x.error and x.error not in seen:
            seen.append(x.error)
        if len(seen) >= 5:
            break
    r.error_samples = seen
    return r


def _chunk_text(obj: dict[str, Any]) -> str:
    choices = obj.get("choices") or []
    if not choices:
        return ""
    c0 = choices[0]
    text = c0.get("text")
    if text is None:  # chat-style delta, just in case
        text = (c0.get("delta") or {}).get("content") or ""
    return text or ""


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    timeout_s: float,
    res: RequestResult | None = None,
) -> RequestResult:
    """Send one completion request (streamed or not) and time it. ``res`` (optional) is
    filled in place, so a caller that cancels the request still sees the tokens so far."""
    t0 = time.perf_counter()
    res = res if res is not None else RequestResult(ok=False)
    try:
        async with asyncio.timeout(timeout_s):
            if body.get("stream"):
                async with client.stream("POST", url, json=body) as resp:
                    res.status = resp.status_code
                    if resp.status_code != 200:
                        text = (await resp.aread()).decode("utf-8", "replace")
                        res.error = f"HTTP {resp.status_code}: {text[:200]}"
                        res.latency_s = time.perf_counter() - t0
                        return res
                    chunks = 0
                    res.t0 = t0
                    last = t0
                    usage_tokens = None
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        try:
                            obj = json.loads(data)
                        except ValueError:
                            continue
                        if "error" in obj and not obj.get("choices"):
                            res.error = f"stream error: {str(obj['error'])[:200]}"
                            res.latency_s = time.perf_counter() - t0
                            return res
                        if _chunk_text(obj):
                            chunks += 1
                            res.completion_tokens = chunks
                            now = time.perf_counter()
                            if res.ttft_s is None:
                                res.ttft_s = now - t0
                            else:
                                res.gaps_s.append(now - last)
                            last = now
                        usage = obj.get("usage")
                        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                            usage_tokens = int(usage["completion_tokens"])
                    res.completion_tokens = usage_tokens if usage_tokens is not None else chunks
            else:
                resp = await client.post(url, json=body)
                res.status = resp.status_code
                if resp.status_code != 200:
                    res.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    res.latency_s = time.perf_counter() - t0
                    return res
                obj = resp.json()
                usage = obj.get("usage") or {}
                res.completion_tokens = int(usage.get("completion_tokens") or 0)
                res.ttft_s = None
        res.latency_s = time.perf_counter() - t0
        res.ok = True
    except TimeoutError:
        res.latency_s = time.perf_counter() - t0
        res.error = f"timeout after {timeout_s:.0f}s"
    except httpx.HTTPError as e:
        res.latency_s = time.perf_counter() - t0
        res.error = f"{type(e).__name__}: {e}"[:200]
    return res


def completion_body(
    model: str | None,
    i: int,
    max_tokens: int,
    stream: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": make_prompt(i),
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
        **SAMPLING,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if model is not None:
        body["model"] = model
    if extra:
        body.update(extra)
    return body


async def run_load(
    base_url: str,
    *,
    label: str,
    model: str | None,
    concurrency: int,
    n_requests: int,
    max_tokens: int = 64,
    stream: bool = True,
    extra: dict[str, Any] | None = None,
    timeout_s: float = 300.0,
    first_index: int = 0,
    client: httpx.AsyncClient | None = None,
    raw: list[RequestResult] | None = None,
    soft_deadline_s: float | None = None,
    hard_deadline_s: float | None = None,
) -> LoadResult:
    """Closed loop: ``concurrency`` clients share ``n_requests`` requests.

    ``soft_deadline_s``: after it no client starts a new request (``n_requests`` becomes
    what was started). ``hard_deadline_s``: requests still running are cancelled; their
    streamed tokens count toward tok/s and they are reported as ``cut``, not as errors.
    These bound the time a very slow server can take."""
    url = base_url.rstrip("/") + "/v1/completions"
    own = client is None
    if client is None:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=30.0),
            limits=httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4),
        )
    counter = iter(range(first_index, first_index + n_requests))
    results: list[RequestResult] = []

    t0 = time.perf_counter()

    async def worker() -> None:
        for i in counter:
            if soft_deadline_s is not None and time.perf_counter() - t0 > soft_deadline_s:
                return
            body = completion_body(model, i, max_tokens, stream=stream, extra=extra)
            res = RequestResult(ok=False)
            results.append(res)
            try:
                await one_request(client, url, body, timeout_s, res)
            except asyncio.CancelledError:
                res.cut = True
                res.latency_s = time.perf_counter() - t0
                raise

    try:
        tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        if hard_deadline_s is None:
            await asyncio.gather(*tasks)
        else:
            done, pending = await asyncio.wait(tasks, timeout=hard_deadline_s)
            for tk in pending:
                tk.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for tk in done:
                tk.result()
        wall = time.perf_counter() - t0
    finally:
        if own:
            await client.aclose()
    if raw is not None:
        raw.extend(results)
    return summarize(label, concurrency, results, wall)


async def run_load_many(
    jobs: list[dict[str, Any]],
) -> list[LoadResult]:
    """Several ``run_load`` at once (e.g. one per model), each with its own kwargs."""
    return list(await asyncio.gather(*(run_load(**j) for j in jobs)))


def combined(label: str, parts: list[LoadResult]) -> LoadResult:
    """Aggregate of loads run at the same time: tokens summed over the longest wall time."""
    r = LoadResult(label=label, concurrency=sum(p.concurrency for p in parts),
                   n_requests=sum(p.n_requests for p in parts))
    r.ok = sum(p.ok for p in parts)
    r.errors = sum(p.errors for p in parts)
    r.status_5xx = sum(p.status_5xx for p in parts)
    r.completion_tokens = sum(p.completion_tokens for p in parts)
    r.wall_s = max((p.wall_s for p in parts), default=0.0)
    r.tok_s = r.completion_tokens / r.wall_s if r.wall_s else 0.0
    r.req_s = r.ok / r.wall_s if r.wall_s else 0.0
    r.tokens_per_request = (r.completion_tokens / r.ok) if r.ok else None
    # percentiles of a combined run are not recomputable from parts; show the worst part's
    for attr in ("ttft_p50_ms", "ttft_p95_ms", "latency_p50_ms", "latency_p95_ms", "latency_max_ms"):
        vals = [getattr(p, attr) for p in parts if getattr(p, attr) is not None]
        setattr(r, attr, max(vals) if vals else None)
    r.cut = sum(p.cut for p in parts)
    r.cut_tokens = sum(p.cut_tokens for p in parts)
    r.tokens_per_request = ((r.completion_tokens - r.cut_tokens) / r.ok) if r.ok else None
    r.error_samples = [e for p in parts for e in p.error_samples][:5]
    return r


def in_turn(label: str, runs: list[LoadResult]) -> LoadResult:
    """Aggregate of loads run one after another (rounds): tokens over the summed wall time."""
    r = combined(label, runs)
    r.concurrency = max((p.concurrency for p in runs), default=0)
    r.wall_s = sum(p.wall_s for p in runs)
    r.tok_s = r.completion_tokens / r.wall_s if r.wall_s else 0.0
    r.req_s = r.ok / r.wall_s if r.wall_s else 0.0
    return r


async def sequential_latency(
    base_url: str,
    *,
    model: str | None,
    n: int,
    max_tokens: int = 1,
    timeout_s: float = 60.0,
) -> list[float]:
    """Latencies (ms) of ``n`` back-to-back non-streamed requests on one keep-alive connection."""
    url = base_url.rstrip("/") + "/v1/completions"
    out: list[float] = []
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for i in range(n):
            body = completion_body(model, 100_000 + i, max_tokens, stream=False)
            r = await one_request(client, url, body, timeout_s)
            if not r.ok:
                raise RuntimeError(f"1-token request failed: {r.error}")
            out.append(r.latency_s * 1000)
    return out


def fmt(v: float | None, nd: int = 1) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


if __name__ == "__main__":  # tiny manual check: python -m bench.clients.loadgen URL [c] [n]
    import sys

    url = sys.argv[1]
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    res = asyncio.run(run_load(url, label="manual", model=None, concurrency=c, n_requests=n))
    print(json.dumps(res.as_dict(), indent=2))
