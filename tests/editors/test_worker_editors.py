"""Infill, reranking and embeddings of a generative model in the real engine (in-process),
on the offline test models (testkit/gguf_models.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from testkit.gguf_models import FIM_TOKEN_IDS
from worker.conftest import run_engine, settings_for

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.output.infill import InfillOutput

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fim_engine(fim_model_path: Path) -> Iterator[object]:
    from corral.worker.engine import Engine

    e = Engine(settings_for(fim_model_path, n_parallel=2, ctx_len=2048, n_batch=256))
    yield e
    e.close()


@pytest.fixture(scope="module")
def rank_engine(reranker_path: Path) -> Iterator[object]:
    from corral.worker.engine import Engine

    e = Engine(settings_for(reranker_path, model_id="tiny-reranker", n_parallel=4, ctx_len=1024))
    yield e
    e.close()


def _infill(rid: str = "f", *, prefix: str = "", suffix: str = "", extra: list[wire.InfillChunk] | None = None,
            prompt: str | None = None, max_tokens: int = 8) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, params=wire.SamplingParams(temperature=0, max_tokens=max_tokens),
                                infill=wire.Infill(prefix=prefix, suffix=suffix, extra=extra or []))


def test_infill_prompt_is_the_repo_level_fim_form(fim_engine) -> None:
    e = fim_engine
    tok = e.tok
    ids = FIM_TOKEN_IDS
    req = _infill(prefix="def add(a, b):\n    ", suffix="\nprint(add(1, 2))\n", prompt="return",
                  extra=[wire.InfillChunk("util.py", "import os\n")])
    got = e.prepare(req).tokens

    def t(text: str) -> list[int]:
        return tok.tokenize(text, add_special=False, parse_special=False)

    want = ([ids["fim_rep"], *t("myproject\n"), ids["fim_sep"], *t("util.py\n"), *t("import os\n"),
             ids["fim_sep"], *t("filename\n"), 2, ids["fim_pre"], *t("def add(a, b):\n    "), *t("return"),
             ids["fim_suf"], *t("\nprint(add(1, 2))\n"), ids["fim_mid"]])
    assert got == want  # 2: Gemma's BOS, which the vocabulary adds


def test_infill_without_file_separators_joins_chunks_as_snippets(fim_plain_model_path: Path) -> None:
    from corral.worker.engine import Engine

    e = Engine(settings_for(fim_plain_model_path, n_parallel=1, ctx_len=1024))
    try:
        ids = FIM_TOKEN_IDS
        got = e.prepare(_infill(prefix="x = ", suffix="\n", extra=[wire.InfillChunk("a.py", "y = 1\n")])).tokens

        def t(text: str) -> list[int]:
            return e.tok.tokenize(text, add_special=False, parse_special=False)

        assert got == [*t("\n\n--- snippet ---\n\n"), *t("y = 1\n"), 2, ids["fim_pre"], *t("x = "),
                       ids["fim_suf"], *t("\n"), ids["fim_mid"]]
    finally:
        e.close()


def test_infill_budgets_prefix_suffix_and_extra_as_llama_server(fim_engine) -> None:
    e = fim_engine
    ids = FIM_TOKEN_IDS
    prefix = " ".join(f"p{i}" for i in range(400))
    suffix = " ".join(f"s{i}" for i in range(400))
    got = e.prepare(_infill(prefix=prefix, suffix=suffix, max_tokens=16)).tokens
    pre, suf, mid = got.index(ids["fim_pre"]), got.index(ids["fim_suf"]), got.index(ids["fim_mid"])
    n_batch = e.m.n_batch
    assert suf - pre - 1 == 3 * (n_batch // 4)  # the prefix's last 3/4 batch
    assert mid - suf - 1 == n_batch // 4 - 2  # the suffix's first (1/4 batch - 2)
    whole = e.tok.tokenize(prefix, add_special=False, parse_special=False)
    assert got[pre + 1:suf] == whole[-(3 * (n_batch // 4)):]
    # extra chunks: whatever fits in n_ctx - n_batch + 2 (llama-server's n_predict -1), keeping their end
    chunk = " ".join(f"x{i}" for i in range(2000))
    got = e.prepare(_infill(prefix="a", extra=[wire.InfillChunk("big.py", chunk)], max_tokens=16)).tokens
    n_extra = got.index(2)  # everything before BOS is extra context
    assert n_extra == e.m.n_ctx_slot - n_batch + 2
    tail = [ids["fim_sep"], *e.tok.tokenize("filename\n", add_special=False, parse_special=False)]
    assert got[n_extra - len(tail):n_extra] == tail  # then the current file's separator
    assert got[n_extra - len(tail) - 1] == e.tok.tokenize(chunk, add_special=False, parse_special=False)[-1]


def test_infill_generates_greedily_and_repeatably(fim_engine) -> None:
    reqs = [_infill(f"g{i}", prefix="def add(a, b):\n    ", suffix="\n", max_tokens=10) for i in range(2)]
    texts, finals, _ = run_engine(fim_engine, reqs)
    assert texts["g0"] == texts["g1"] and texts["g0"]
    assert all(isinstance(finals[k], wire.Finished) and finals[k].usage.completion_tokens == 10 for k in finals)


def test_a_model_without_fim_tokens_is_refused_by_name(engine) -> None:
    with pytest.raises(RequestRejected) as ei:
        engine.prepare(_infill(prefix="x"))
    assert ei.value.code == "invalid_request" and "gemma-3-270m" in ei.value.message and "FIM" in ei.value.message


def test_n_indent_cuts_the_first_line_indented_less() -> None:
    out = InfillOutput("r", [], None, n_indent=4)
    sent = ""
    for piece in [b"x = 1\n", b"    y", b" = 2\n", b"  ", b"z = 3\n"]:
        d = out.token(piece, None)
        sent += d.text if d is not None else ""
        if out.stopped:
            break
    assert out.stopped and sent == "x = 1\n    y = 2\n  "  # cut where the short line's text starts
    assert out.finish() is None


def test_rerank_scores_are_deterministic_and_batched_across_requests(rank_engine) -> None:
    e = rank_engine
    docs = ["paris is the capital of france", "the cat", "dogs run", "code in python", "big red car"]
    q = "what is the capital of france"
    _, alone, _ = run_engine(e, [wire.EmbedRequest(id="a", inputs=docs, query=q, normalize=False)])
    reqs = [wire.EmbedRequest(id=f"r{i}", inputs=[d], query=q, normalize=False) for i, d in enumerate(docs)]
    _, together, _ = run_engine(e, reqs)  # five requests, one decode
    scores = [s[0] for s in alone["a"].data]
    assert len(scores) == 5 and len(set(scores)) == 5
    for i in range(5):
        assert together[f"r{i}"].data[0][0] == pytest.approx(scores[i], abs=1e-5)
    assert alone["a"].prompt_tokens == sum(t.prompt_tokens for t in together.values())


def test_rerank_refusals(rank_engine, engine) -> None:
    e = rank_engine
    long_query = " ".join(["cat"] * 2000)
    _, f, _ = run_engine(e, [wire.EmbedRequest(id="q", inputs=["dog"], query=long_query),
                             wire.EmbedRequest(id="d", inputs=["dog", ""], query="cat"),
                             wire.EmbedRequest(id="ok", inputs=["dog"], query="cat")])
    assert f["q"].code == "context_length_exceeded" and "query" in f["q"].message
    assert f["d"].code == "invalid_request" and "documents[1]" in f["d"].message
    assert isinstance(f["ok"], wire.Embeddings)  # the others' failures cost it nothing
    _, f, _ = run_engine(engine, [wire.EmbedRequest(id="x", inputs=["dog"], query="cat")])
    assert f["x"].code == "invalid_request" and "does not rerank" in f["x"].message


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_a_generative_model_embeds_on_a_second_context(fim_engine, fim_model_path: Path) -> None:
    from corral.worker.engine import Engine
    from corral.worker.model import rss_bytes

    e = fim_engine
    kv_before = e.stats().kv_bytes
    model_bytes = e.stats().model_bytes
    texts = ["hello world", "def add(a, b): return a + b", "goodbye"]
    rss_before = rss_bytes()
    _, f, _ = run_engine(e, [wire.EmbedRequest(id="e", inputs=texts)])
    assert rss_bytes() - rss_before < model_bytes // 2  # no second copy of the weights
    vecs = f["e"].data
    assert len(vecs) == 3 and all(len(v) == 640 for v in vecs)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4) for v in vecs)
    st = e.stats()
    assert st.kv_bytes > kv_before and st.model_bytes == model_bytes  # a context more, not weights
    # generation still works beside it
    texts_out, _, _ = run_engine(e, [_infill("after", prefix="x = ", max_tokens=3)])
    assert texts_out.get("after") is not None
    # the same vectors as an embedding-only instance of the same file (mean pooling), input by
    # input (a decode of several inputs differs in the last digits: other matmul kernels)
    alone = [run_engine(e, [wire.EmbedRequest(id=f"a{i}", inputs=[t])])[1][f"a{i}"].data[0]
             for i, t in enumerate(texts)]
    ref = Engine(settings_for(fim_model_path, embedding=True, n_parallel=1, ctx_len=512))
    try:
        _, g, _ = run_engine(ref, [wire.EmbedRequest(id="r", inputs=texts)])
    finally:
        ref.close()
    for a, b in zip(alone, g["r"].data):
        assert _cos(a, b) > 1 - 1e-6


def test_embedding_truncation(fim_engine) -> None:
    e = fim_engine
    long = "word " * 3000
    _, f, _ = run_engine(e, [wire.EmbedRequest(id="no", inputs=[long]),
                             wire.EmbedRequest(id="yes", inputs=[long], truncate=True)])
    assert f["no"].code == "context_length_exceeded"
    # an input is whole in one micro-batch: at most n_batch tokens (llama-server's -ub)
    assert isinstance(f["yes"], wire.Embeddings) and f["yes"].prompt_tokens == min(e.m.n_ctx_slot, e.m.n_batch)
