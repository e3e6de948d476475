"""The engine in-process with the real model: sampling, stops, reuse, limits, aborts."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as ll
import pytest

from corral import wire
from corral.control import generation_defaults
from corral.worker.engine import Engine

from .conftest import run_engine, settings_for, REUSED_TAIL

pytestmark = pytest.mark.integration

GREEDY = wire.SamplingParams(max_tokens=24, temperature=0.0)
PROMPT = "The history of the Roman empire begins"


def gen(rid: str, prompt: str = PROMPT, params: wire.SamplingParams = GREEDY) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, params=params)


def test_greedy_counts_and_usage(engine: Engine) -> None:
    texts, finals, deltas = run_engine(engine, [gen("g1")])
    fin = finals["g1"]
    assert isinstance(fin, wire.Finished)
    assert fin.usage.prompt_tokens > 3
    assert fin.finish_reason in ("length", "stop")
    if fin.finish_reason == "length":
        assert fin.usage.completion_tokens == 24
    assert sum(d.n_tokens for d in deltas["g1"]) <= fin.usage.completion_tokens
    assert texts["g1"].strip()
    assert fin.timings.prompt_ms > 0 and fin.timings.predicted_ms > 0


def test_fixed_seed_reproducible_and_seed_matters(engine: Engine) -> None:
    p1 = wire.SamplingParams(max_tokens=24, temperature=1.0, seed=1234)
    p2 = wire.SamplingParams(max_tokens=24, temperature=1.0, seed=99)
    a, _, _ = run_engine(engine, [gen("s1", params=p1)])
    b, _, _ = run_engine(engine, [gen("s2", params=p1)])
    c, _, _ = run_engine(engine, [gen("s3", params=p2)])
    assert a["s1"] == b["s2"]
    assert a["s1"] != c["s3"]


def test_stop_string_never_emitted(engine: Engine) -> None:
    full, _, _ = run_engine(engine, [gen("st0")])
    text = full["st0"]
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    assert len(stop) == 4
    want = text[: text.find(stop)]
    out, finals, _ = run_engine(
        engine, [gen("st1", params=wire.SamplingParams(max_tokens=24, temperature=0.0, stop=[stop]))]
    )
    assert out.get("st1", "") == want
    assert stop not in out.get("st1", "")
    assert finals["st1"].finish_reason == "stop"


def test_prefix_reuse_identical_output_and_cached_tokens(engine: Engine) -> None:
    # Fill every slot with unrelated text so the first run starts from an empty prefix.
    run_engine(engine, [gen(f"fill{i}", prompt=f"Unrelated text number {i}:") for i in range(4)])
    # Greedy: the reused prefix stops where the prompt's last cut began, so its last 4 tokens
    # decode again in the batch shape they had (worker/prefill.py): the same answer.
    p = wire.SamplingParams(max_tokens=16, temperature=0.0)
    prompt = "In a quiet village by the sea, an old fisherman told stories about"
    a, fa, _ = run_engine(engine, [gen("r1", prompt, p)])
    b, fb, _ = run_engine(engine, [gen("r2", prompt, p)])
    assert fa["r1"].usage.cached_tokens < 3  # at most the BOS and a shared first word
    assert fb["r2"].usage.cached_tokens == fb["r2"].usage.prompt_tokens - REUSED_TAIL
    assert fb["r2"].slot == fa["r1"].slot  # the slot with the longest prefix was chosen
    assert a["r1"] == b["r2"]
    # A longer prompt that extends the first one reuses the whole first prompt.
    c, fc, _ = run_engine(engine, [gen("r3", prompt + " the storm", p)])
    assert fc["r3"].usage.cached_tokens >= min(fa["r1"].usage.prompt_tokens, fc["r3"].usage.prompt_tokens - REUSED_TAIL)


def test_abort_frees_slot_within_a_step(engine: Engine) -> None:
    long = wire.SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    for i in range(4):
        engine.submit(gen(f"ab{i}", params=long))
    engine.submit(gen("after", params=GREEDY))
    engine.step()
    engine.step()
    assert all(s.busy for s in engine.slots)
    engine.abort("ab2")
    engine.abort("no-such-id")  # unknown ids are ignored
    out = engine.step()
    fin = [m for m in out if isinstance(m, wire.Finished) and m.id == "ab2"]
    assert fin and fin[0].finish_reason == "abort"
    for i in (0, 1, 3):
        engine.abort(f"ab{i}")
    texts, finals, _ = run_engine(engine, [])
    assert finals["after"].finish_reason in ("length", "stop")
    assert finals["after"].usage.completion_tokens > 0
    assert not engine.has_work


def test_abort_while_queued(engine: Engine) -> None:
    engine.submit(gen("q-a", params=wire.SamplingParams(max_tokens=1)))
    assert engine.waiting
    engine.abort("q-a")
    out = engine.step()
    assert [(m.id, m.finish_reason) for m in out] == [("q-a", "abort")]


def test_prompt_too_long_refused_then_next_works(engine: Engine) -> None:
    long_prompt = "word " * 2000
    _, finals, _ = run_engine(engine, [gen("big", prompt=long_prompt)])
    f = finals["big"]
    assert isinstance(f, wire.RequestFailed)
    assert f.code == "context_length_exceeded"
    assert "1024" in f.message  # names the per-slot context
    _, finals, _ = run_engine(engine, [gen("small")])
    assert isinstance(finals["small"], wire.Finished)


def test_bad_requests_answered_not_raised(engine: Engine) -> None:
    _, f, _ = run_engine(engine, [wire.GenerateRequest(id="neither")])
    assert f["neither"].code == "invalid_request"
    # a generative model embeds (a second context), but does not rerank (no rank pooling)
    _, f, _ = run_engine(engine, [wire.EmbedRequest(id="emb", inputs=["x"], query="y")])
    assert f["emb"].code == "invalid_request"
    _, f, _ = run_engine(engine, [wire.EmbedRequest(id="emb0", inputs=[])])
    assert f["emb0"].code == "invalid_request"
    _, f, _ = run_engine(engine, [wire.GenerateRequest(id="empty", prompt="", add_special=False)])
    assert f["empty"].code == "invalid_request"


def test_max_tokens_none_runs_to_slot_context(engine: Engine) -> None:
    p = wire.SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)
    prompt = "x " * 1000  # about 1000 tokens of a 1024-token slot
    _, finals, _ = run_engine(engine, [gen("fill", prompt=prompt, params=p)])
    f = finals["fill"]
    assert f.finish_reason == "length"
    assert f.usage.prompt_tokens + f.usage.completion_tokens == engine.info.n_ctx_slot


def test_the_models_default_max_tokens_caps_a_request_that_sets_none(model_path: Path) -> None:
    """The router adds the model's default_max_tokens (control/generation_defaults.py) to
    a request that sets none; the worker runs what it got."""
    settings = settings_for(model_path, n_parallel=1, ctx_len=256, default_max_tokens=5)
    e = Engine(settings)
    try:
        unlimited = gen("capped", params=wire.SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True))
        asked = gen("asked", params=wire.SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True))
        _, finals, _ = run_engine(e, [generation_defaults.apply(settings, unlimited),
                                      generation_defaults.apply(settings, asked)])
        assert (finals["capped"].finish_reason, finals["capped"].usage.completion_tokens) == ("length", 5)
        assert finals["asked"].usage.completion_tokens == 9  # a request's own limit wins
    finally:
        e.close()


def test_non_ascii_streams_as_whole_characters(engine: Engine) -> None:
    texts, finals, deltas = run_engine(
        engine, [gen("ja", prompt="日本の首都は東京です。東京は", params=wire.SamplingParams(max_tokens=24, temperature=0.0))]
    )
    text = texts["ja"]
    assert any(ord(ch) > 0x3000 for ch in text), text
    assert "\ufffd" not in text
    for d in deltas["ja"]:
        d.text.encode("utf-8")  # every delta is valid on its own


def test_chat_messages_use_plain_template(engine: Engine) -> None:
    msgs = [wire.ChatMessage("system", "You answer briefly."), wire.ChatMessage("user", "Say hi.")]
    texts, finals, _ = run_engine(
        engine, [wire.GenerateRequest(id="chat", messages=msgs, params=GREEDY)]
    )
    f = finals["chat"]
    assert isinstance(f, wire.Finished)
    expected = engine.tok.tokenize("You answer briefly.\nUser: Say hi.\nAssistant:", add_special=True)
    assert f.usage.prompt_tokens == len(expected)


def test_plain_template_chat_ends_at_the_next_turn(engine: Engine) -> None:
    """A base model continues the conversation on its own ("\nUser: ..."); the plain
    template's turn prefixes end the answer, and never appear in it."""
    msgs = [wire.ChatMessage("user", "What is the capital of France?")]
    params = wire.SamplingParams(max_tokens=40, temperature=0.0)
    texts, finals, _ = run_engine(engine, [wire.GenerateRequest(id="turn", messages=msgs, params=params)])
    raw, _, _ = run_engine(engine, [gen("raw", prompt="User: What is the capital of France?\nAssistant:",
                                        params=params)])
    assert "\nUser:" in raw["raw"]  # what the model writes when nothing stops it
    assert finals["turn"].finish_reason == "stop"
    assert texts["turn"] == raw["raw"][: raw["raw"].index("\nUser:")]
    # ignore_eos: the caller wants every token, turn markers included
    ign = wire.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    _, f2, _ = run_engine(engine, [wire.GenerateRequest(id="ign", messages=msgs, params=ign)])
    assert f2["ign"].usage.completion_tokens == 40


def test_jinja_template_override_and_template_errors(model_path: Path) -> None:
    tmpl = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
        "{{ bos_token }}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{{ '<start_of_turn>model\n' }}"
    )
    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=512, chat_template=tmpl))
    try:
        assert e.info.has_chat_template
        _, f, _ = run_engine(e, [wire.GenerateRequest(id="ok", messages=[wire.ChatMessage("user", "Hi")],
                                                      params=wire.SamplingParams(max_tokens=4))])
        assert isinstance(f["ok"], wire.Finished)
        # "<bos>" in the rendered text is parsed as the BOS token, not added twice.
        want = e.tok.tokenize("<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
                              add_special=False)
        assert want[0] == 2 and want[1] != 2
        assert f["ok"].usage.prompt_tokens == len(want)
        _, f, _ = run_engine(e, [wire.GenerateRequest(id="bad", messages=[wire.ChatMessage("system", "x")])])
        assert f["bad"].code == "invalid_request" and "no system" in f["bad"].message
    finally:
        e.close()


def test_a_neighbours_seed_does_not_change_a_seeded_request(model_path: Path) -> None:
    """A seeded request's random draws are its own: beside the same neighbour (the same
    batch shapes, so the same logits) it gives the same text whatever seed the neighbour
    has, and twice the same. Alone against beside another is not compared: llama.cpp's CPU
    kernels may round with a batch's shape (on an AMD EPYC the two parted), so that equality
    is not something corral can promise on every machine."""
    p = wire.SamplingParams(max_tokens=16, temperature=0.9, seed=42)

    def pair(rid: str, neighbour_seed: int) -> tuple[str, str]:
        q = wire.SamplingParams(max_tokens=16, temperature=0.9, seed=neighbour_seed)
        fresh = Engine(settings_for(model_path))  # empty slots: every pair decodes in the same batch shapes
        try:
            texts, _, _ = run_engine(fresh, [gen(rid, "Once upon a time", p), gen(rid + "-n", "Something else", q)])
        finally:
            fresh.close()
        return texts[rid], texts[rid + "-n"]

    a, na = pair("p1", 7)
    b, nb = pair("p2", 8)
    c, nc = pair("p3", 7)
    assert na != nb  # the neighbour's seed did change its own draws
    assert a == b == c
    assert na == nc


@pytest.mark.parametrize(
    "params",
    [
        wire.SamplingParams(max_tokens=-1),
        wire.SamplingParams(repeat_penalty=0.0),
        wire.SamplingParams(top_p=1.5),
        wire.SamplingParams(temperature=float("nan")),
    ],
)
def test_bad_sampling_params_refused(engine: Engine, params: wire.SamplingParams) -> None:
    _, f, _ = run_engine(engine, [gen("badp", params=params)])
    assert isinstance(f["badp"], wire.RequestFailed) and f["badp"].code == "invalid_request"


def test_penalties_and_sampling_knobs_run(engine: Engine) -> None:
    p = wire.SamplingParams(max_tokens=12, temperature=0.7, top_k=5, top_p=0.9, min_p=0.1,
                            repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, seed=5)
    a, f, _ = run_engine(engine, [gen("pen", "la la la la la la la", p)])
    assert f["pen"].usage.completion_tokens == 12
    b, _, _ = run_engine(engine, [gen("nopen", "la la la la la la la",
                                      wire.SamplingParams(max_tokens=12, temperature=0.0))])
    c, _, _ = run_engine(engine, [gen("pen0", "la la la la la la la",
                                      wire.SamplingParams(max_tokens=12, temperature=0.0, repeat_penalty=2.0))])
    assert b["nopen"] != c["pen0"]  # the penalty changes greedy output on a repetitive prompt


def test_max_tokens_zero(engine: Engine) -> None:
    _, f, d = run_engine(engine, [gen("zero", params=wire.SamplingParams(max_tokens=0))])
    assert f["zero"].finish_reason == "length" and f["zero"].usage.completion_tokens == 0
    assert "zero" not in d


def test_internal_error_fails_one_request_only(engine: Engine) -> None:
    class Broken:
        def push(self, data: bytes) -> str:
            raise RuntimeError("injected")

    p = wire.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine.submit(gen("victim", params=p))
    engine.submit(gen("bystander", prompt="Another prompt", params=p))
    seen: set[str] = set()
    for _ in range(2):  # a prompt's last 4 tokens decode in a step of their own (prefill.prompt_cuts)
        seen |= {m.id for m in engine.step()}
    assert seen == {"victim", "bystander"}
    victim = next(s for s in engine.slots if s.job is not None and s.job.req.id == "victim")
    assert victim.out is not None
    victim.out.utf8 = Broken()  # type: ignore[assignment]
    texts, finals, _ = run_engine(engine, [])
    assert isinstance(finals["victim"], wire.RequestFailed) and finals["victim"].code == "internal"
    assert "injected" in finals["victim"].message
    assert isinstance(finals["bystander"], wire.Finished)
    assert finals["bystander"].usage.completion_tokens == 8
    assert not victim.busy and victim.cached == []


def test_long_prompt_is_chunked_and_does_not_stall_streams(model_path: Path) -> None:
    e = Engine(settings_for(model_path, n_parallel=2, ctx_len=2048, n_batch=64))
    try:
        p = wire.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        e.submit(gen("runner", "Count with me: one, two,", p))
        e.step()  # runner's prompt and first token
        long_prompt = "The sea was calm that night. " * 50
        e.submit(gen("long", long_prompt, wire.SamplingParams(max_tokens=2)))
        steps_until_long_starts = 0
        runner_tokens = 0
        while True:
            out = e.step()
            runner_tokens += sum(m.n_tokens for m in out if isinstance(m, wire.Delta) and m.id == "runner")
            if any(m.id == "long" for m in out):
                break
            steps_until_long_starts += 1
        n_prompt = len(e.tok.tokenize(long_prompt, add_special=True))
        assert n_prompt > 300
        # The prompt took several steps of at most 63 tokens (64 minus the runner's token),
        # and the runner got a token in every one of them.
        assert steps_until_long_starts + 1 >= n_prompt // 63
        assert runner_tokens >= steps_until_long_starts
        run_engine(e, [])
    finally:
        e.close()


def test_set_threads_reaches_the_context(model_path: Path) -> None:
    import llama_cpp as ll

    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=512, threads=2, threads_batch=2))
    try:
        e.set_threads(1)
        assert (ll.llama_n_threads(e.m.ctx), ll.llama_n_threads_batch(e.m.ctx)) == (1, 1)
        e.set_threads(2)
        assert (ll.llama_n_threads(e.m.ctx), ll.llama_n_threads_batch(e.m.ctx)) == (2, 2)
        _, f, _ = run_engine(e, [gen("t", params=wire.SamplingParams(max_tokens=2))])
        assert isinstance(f["t"], wire.Finished)
    finally:
        e.close()


def test_the_compute_buffer_holds_the_rows_asked_for_not_a_micro_batch(engine: Engine) -> None:
    """llama.cpp sizes the compute buffer for a micro-batch of logits unless told fewer
    (fit.rows.outputs_max): the engine's is for its slots and ECHO_CHUNK prompt rows. Two
    requests asking for their prompts' logprobs at once (more rows than ECHO_CHUNK each)
    share those rows step by step and each gets a logprob for every prompt token after the first."""
    from corral.fit.rows import ECHO_CHUNK, outputs_max

    m = engine.m
    compute = sum(b.bytes for b in engine.info.buffers if b.kind == "compute")
    rows = outputs_max(engine.settings, m.n_slots)
    assert rows == m.n_slots + ECHO_CHUNK
    micro = ll.llama_n_ubatch(m.ctx)
    assert 4 * rows * m.n_vocab <= compute < 4 * micro * m.n_vocab // 2, (compute, rows, micro)
    long = " ".join(f"word{i}" for i in range(60))
    reqs = [wire.GenerateRequest(id=f"echo{i}", prompt=f"{long} {i}", params=wire.SamplingParams(max_tokens=1, temperature=0.0),
                                 echo=True, logprobs=1) for i in range(2)]
    n_prompt = [len(engine.tok.tokenize(r.prompt, add_special=True)) for r in reqs]
    assert min(n_prompt) > ECHO_CHUNK
    _, finals, deltas = run_engine(engine, reqs)
    for r, n in zip(reqs, n_prompt):
        assert isinstance(finals[r.id], wire.Finished), finals[r.id]
        echoed = deltas[r.id][0]
        lps = echoed.logprobs
        assert lps is not None and len(lps) == n and lps[0].logprob is None  # the first has none
        assert all(lp.logprob is not None for lp in lps[1:])


def test_the_context_computes_on_a_persistent_threadpool(engine: Engine) -> None:
    """As llama-server's (worker/host/threadpool.py): attached for the context's life."""
    assert engine.threadpool is not None and engine.threadpool.pool
    engine.set_threads(1)
    try:
        texts, _, _ = run_engine(engine, [gen("tp1")])
    finally:
        engine.set_threads(engine.m.threads)
    texts2, _, _ = run_engine(engine, [gen("tp2")])
    assert texts["tp1"] and texts["tp1"] == texts2["tp2"]  # the same greedy text on fewer threads
