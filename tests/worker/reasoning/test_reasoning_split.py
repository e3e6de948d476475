"""The thinking/answer split on scripted streams (no model): every format, the stream cut
at every character (and, through the UTF-8 decoder, at every byte), and the request
decisions (on/off, budgets, levels, bad input)."""

from __future__ import annotations

import itertools
import json

import pytest

from corral import wire

from corral.model import reasoning_format
from corral.model.reasoning_format import FORMATS, detect
from corral.worker.reasoning import plan as reasoning
from corral.worker.output.detokenize import Utf8Stream
from corral.worker.failures import RequestRejected
from corral.worker.output.slot_output import SlotOutput
from corral.worker.reasoning.split import HarmonySplitter, TagSplitter
from corral.worker.output.toolcalls import ToolCallParser

DS = FORMATS["deepseek"]
HARMONY = FORMATS["harmony"]


def run(splitter: TagSplitter | HarmonySplitter, chunks: list[str]) -> tuple[str, str]:
    r, a = [], []
    for c in chunks:
        x, y = splitter.push(c)
        r.append(x)
        a.append(y)
    x, y = splitter.finish()
    return "".join(r) + x, "".join(a) + y


def cuts(text: str) -> list[list[str]]:
    """The text whole, cut once at every position, and in single characters."""
    out = [[text], list(text)]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    out += [[text[:i], text[i:j], text[j:]] for i, j in itertools.combinations(range(1, len(text)), 2)
            if (i * 7 + j) % 5 == 0]  # a sample of the double cuts
    return out


TAG_CASES = [
    # (format, initial, text, reasoning, answer)
    (DS, "start", "<think>\nI ponder.\n</think>\n\nThe answer.", "I ponder.", "The answer."),
    (DS, "start", "  <think>a < b </think>ok", "a < b", "ok"),
    (DS, "start", "No thinking here, <think> is text.", "", "No thinking here, <think> is text."),
    (DS, "reasoning", "\nopened by the prompt</think>\n\nanswer </think> stays", "opened by the prompt",
     "answer </think> stays"),
    (DS, "reasoning", "never closed </thi", "never closed", ""),  # a tag's start never leaks
    (DS, "start", "<think>\n\n</think>\n\nempty thinking", "", "empty thinking"),
    (DS, "answer", "<think>x</think>y", "", "<think>x</think>y"),
    (DS, "start", "<thi", "", "<thi"),
    (FORMATS["magistral"], "start", "[THINK]hmm[/THINK]yes", "hmm", "yes"),
    (FORMATS["command-r"], "start", "<|START_THINKING|>plan<|END_THINKING|>done", "plan", "done"),
    (FORMATS["seed"], "start", "<seed:think>s</seed:think>t", "s", "t"),
    (DS, "start", "<think>ünïcödé 思考</think>答え", "ünïcödé 思考", "答え"),
]


@pytest.mark.parametrize("fmt,initial,text,want_r,want_a", TAG_CASES)
def test_tag_split_at_every_cut(fmt: reasoning_format.ReasoningFormat, initial: str, text: str, want_r: str,
                                want_a: str) -> None:
    for chunks in cuts(text):
        got = run(TagSplitter(fmt, initial), chunks)
        assert got == (want_r, want_a), chunks


def byte_cuts(data: bytes) -> list[list[bytes]]:
    """Cut once at every byte, and in single bytes."""
    return [[data[i:i + 1] for i in range(len(data))]] + [[data[:i], data[i:]] for i in range(1, len(data))]


def run_bytes(splitter: TagSplitter | HarmonySplitter, chunks: list[bytes]) -> tuple[str, str]:
    u = Utf8Stream()
    text = [u.push(c) for c in chunks] + [u.flush()]
    return run(splitter, text)


@pytest.mark.parametrize("fmt,initial,text,want_r,want_a", TAG_CASES)
def test_tag_split_at_every_byte_through_the_decoder(fmt: reasoning_format.ReasoningFormat, initial: str,
                                                     text: str, want_r: str, want_a: str) -> None:
    for chunks in byte_cuts(text.encode()):
        assert run_bytes(TagSplitter(fmt, initial), chunks) == (want_r, want_a), chunks


def test_harmony_split_at_every_byte() -> None:
    text = H_FINAL.replace("Hi!", "Grüße, 世界")
    for chunks in byte_cuts(text.encode()):
        assert run_bytes(HarmonySplitter(HARMONY), chunks) == ("Think <|x|> more.", "Grüße, 世界"), chunks


H_TEXT = ("<|channel|>analysis<|message|>User asks weather. Call tool.<|end|>"
          "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
          "<|message|>{\"city\": \"Paris\"}")
H_FINAL = "<|channel|>analysis<|message|>Think <|x|> more.<|end|><|start|>assistant<|channel|>final<|message|>Hi!"


def test_harmony_analysis_final_and_every_cut() -> None:
    for chunks in cuts(H_FINAL):
        assert run(HarmonySplitter(HARMONY), chunks) == ("Think <|x|> more.", "Hi!"), chunks


def test_harmony_tool_call_becomes_a_parsed_call() -> None:
    for chunks in cuts(H_TEXT)[:200]:
        r, a = run(HarmonySplitter(HARMONY), chunks)
        assert r == "User asks weather. Call tool."
        p = ToolCallParser()
        text, calls = p.push(a)
        more, late = p.finish()
        calls += late
        assert (text + more).strip() == ""
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_harmony_recipient_in_the_role_header_and_plain_output() -> None:
    t = ("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
         "<|message|>{}<|call|>")
    r, a = run(HarmonySplitter(HARMONY), list(t))
    assert r == "x" and a == '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert run(HarmonySplitter(HARMONY), ["Just ", "text"]) == ("", "Just text")
    assert run(HarmonySplitter(HARMONY, "reasoning"), ["opened<|end|><|start|>assistant<|channel|>final",
                                                       "<|message|>ans"]) == ("opened", "ans")


def test_detect_formats_from_templates() -> None:
    assert detect(None) == "none" and detect("{{ messages }}") == "none"
    assert detect("{{ '<|im_start|>assistant\\n<think>\\n' }}") == "deepseek"
    assert detect("{% if x %}<|channel|>analysis<|message|>{% endif %}") == "harmony"
    assert detect("[THINK]") == "magistral"
    assert reasoning_format.resolve("none", "<think>") is None
    assert reasoning_format.resolve("deepseek", None) is DS


# ------------------------------------------------------------------ the slot's split and budget


def slot_reasoning(initial: str = "start", prefix: list[int] | None = None, budget: int = -1,
                   close: list[int] | None = None) -> reasoning.SlotReasoning:
    plan = reasoning.ReasoningPlan(DS, initial, "", budget)
    return reasoning.SlotReasoning(plan, prefix or [], close or [901, 902], [], None)


def test_budget_forces_the_close_after_exactly_n_thinking_tokens() -> None:
    r = slot_reasoning("reasoning", budget=3)
    out = SlotOutput("x", ["STOP"], None, reasoning=r)
    deltas = [out.token(p.encode(), None) for p in ("a", "b", "c")]
    assert r.n_tokens == 3
    assert [r.next_forced(), r.next_forced(), r.next_forced()] == [901, 902, None]
    deltas += [out.token(b"</thi", None), out.token(b"nk>", None), out.token(b"answer STOP more", None)]
    assert "".join(d.reasoning for d in deltas if d) == "abc"
    assert "".join(d.text for d in deltas if d) == "answer "
    assert out.stopped and r.n_tokens == 3  # stop strings apply to the answer only


def test_stop_string_inside_the_thinking_does_not_stop() -> None:
    out = SlotOutput("x", ["STOP"], None, reasoning=slot_reasoning("reasoning"))
    d = out.token(b"a STOP b</think>c", None)
    assert d is not None and d.reasoning == "a STOP b" and d.text == "c" and not out.stopped


def test_eog_inside_the_thinking_is_replaced_by_the_close() -> None:
    r = slot_reasoning("reasoning")
    r.token("thought")
    assert r.replace_eog() == 901 and r.next_forced() == 902
    r.token("</think>")
    r.token("")
    assert r.replace_eog() is None  # in the answer an end token ends the request


def test_budget_zero_with_the_prompt_opened_closes_at_once() -> None:
    r = slot_reasoning("reasoning", budget=0)
    assert list(r.forced) == [901, 902]


# ------------------------------------------------------------------ what a request asks


def ws(**kw: object) -> wire.WorkerSettings:
    return wire.WorkerSettings(model_id="m", model_path="/x", **kw)  # type: ignore[arg-type]


def gr(**kw: object) -> wire.GenerateRequest:
    return wire.GenerateRequest(id="r", messages=[wire.ChatMessage("user", "hi")], **kw)  # type: ignore[arg-type]


def test_wanted_defaults_levels_caps_and_refusals() -> None:
    assert reasoning.wanted(DS, ws(), gr()) == reasoning.Thinking(True, -1, None)
    assert reasoning.wanted(DS, ws(reasoning_budget=50), gr()) == reasoning.Thinking(True, 50, None)
    assert reasoning.wanted(DS, ws(reasoning_budget_max=100), gr()) == reasoning.Thinking(True, 100, None)
    assert reasoning.wanted(DS, ws(), gr(reasoning_effort="low")).budget == 1024
    assert reasoning.wanted(DS, ws(reasoning_budget_max=10), gr(reasoning_effort="high")).budget == 10
    assert reasoning.wanted(DS, ws(), gr(thinking_budget=7)) == reasoning.Thinking(True, 7, None)
    assert not reasoning.wanted(DS, ws(), gr(think=False)).on
    assert not reasoning.wanted(DS, ws(), gr(reasoning_effort="none")).on
    assert not reasoning.wanted(DS, ws(), gr(template_kwargs={"enable_thinking": False})).on
    assert not reasoning.wanted(DS, ws(), gr(thinking_budget=0)).on
    assert reasoning.wanted(None, ws(), gr(think=False)) is None
    for bad, match in ((gr(thinking_budget=-1), "below 0"), (gr(reasoning_effort="huge"), "not a level"),
                       (gr(thinking_budget=11), "above")):
        with pytest.raises(RequestRejected, match=match):
            reasoning.wanted(DS, ws(reasoning_budget_max=10), bad)
    with pytest.raises(RequestRejected, match="does not support thinking"):
        reasoning.wanted(None, ws(), gr(think=True))


def test_plans_from_the_rendered_prompt() -> None:
    on, off = reasoning.Thinking(True, 5), reasoning.Thinking(False, 0)
    assert reasoning.plan(DS, on, "<|im_start|>assistant\n<think>\n") == reasoning.ReasoningPlan(DS, "reasoning", "", 5)
    assert reasoning.plan(DS, on, "assistant\n") == reasoning.ReasoningPlan(DS, "start", "<think>", 5)
    assert reasoning.plan(DS, off, "assistant\n<think>\n\n</think>\n\n").initial == "answer"
    assert reasoning.plan(DS, off, "assistant\n").prefix == DS.empty
    p = reasoning.plan(DS, off, "assistant\n<think>\n")
    assert p.initial == "reasoning" and p.budget == 0  # closed at once
    assert reasoning.plan(HARMONY, off, "<|start|>assistant").prefix == "<|channel|>final<|message|>"
    assert reasoning.template_vars(on, gr(), "{% if enable_thinking %}") == {"enable_thinking": True}
    assert reasoning.template_vars(reasoning.Thinking(True, 5, "high"), gr(), "{{ reasoning_effort }}") == \
        {"reasoning_effort": "high"}


def test_templates_get_the_variables_and_the_history_thinking() -> None:
    from corral.worker.prompt.templates import JinjaTemplate, PlainTemplate

    t = JinjaTemplate("{% for m in messages %}[{{ m['reasoning_content'] }}/{{ m['thinking'] }}]{{ m['content'] }}"
                      "{% endfor %}{{ enable_thinking }}{{ raise_exception is callable }}")
    msgs = [wire.ChatMessage("user", "q"), wire.ChatMessage("assistant", "a", reasoning="r")]
    out = t.render(msgs, None, {"enable_thinking": False, "messages": [], "raise_exception": "x"})
    assert out == "[/]q[r/r]aFalseTrue"  # request variables never replace messages or functions
    assert PlainTemplate().render(msgs) == "User: q\nAssistant: a\nAssistant:"  # dropped cleanly


def test_control_tokens_of_the_tags_render_for_splitting_slots_only() -> None:
    """gpt-oss's <|channel|> etc. are control tokens (no text by default): a slot that splits
    gets their text, any other slot of the model still gets nothing for them."""
    from corral.worker.reasoning.feature import ReasoningFeature
    from corral.worker.slots import Job, Slot

    specials = {"<|channel|>": 7, "<|message|>": 8, "<|end|>": 9, "<|start|>": 10}

    class Tok:
        eog_tokens: list[int] = []

        def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
            out, rest = [], text
            while rest:
                tag = next((t for t in specials if rest.startswith(t)), None)
                out.append(specials[tag] if tag else ord(rest[0]) + 100)
                rest = rest[len(tag) if tag else 1:]
            return out

        def piece(self, t: int) -> bytes:
            return b"" if t < 100 else chr(t - 100).encode()

        def special_text(self, t: int) -> str:
            return next(k for k, v in specials.items() if v == t)

    er = ReasoningFeature(ws(), None, Tok(), "harmony")  # type: ignore[arg-type]
    assert er.tag_pieces == {7: b"<|channel|>", 8: b"<|message|>", 9: b"<|end|>", 10: b"<|start|>"}
    assert er.close_ids[0] == 9 and er.reopen[:1] == [10]
    splitting = Slot(0)
    plan = reasoning.ReasoningPlan(DS, "answer", "", -1)
    assert er.admitted(splitting, Job(gr(), [1], 0.0, reasoning=plan))  # a plan: the slot joins the feature
    assert not er.admitted(Slot(1), Job(gr(), [1], 0.0))  # none: it pays nothing per token
    assert splitting.reasoning is not None and splitting.reasoning.tag_pieces == er.tag_pieces

    def text(out: SlotOutput, token: int) -> str:
        deltas = [out.token(b"", None, token), out.finish()]
        return "".join(d.text for d in deltas if d is not None)

    assert text(SlotOutput("s", [], None, reasoning=splitting.reasoning), 7) == "<|channel|>"
    assert text(SlotOutput("p", [], None), 7) == ""  # a slot that does not split: no text


def test_optional_thinking_is_ignored_without_a_format_and_clamped_to_the_cap() -> None:
    """Anthropic's thinking (``thinking_optional``): a preference, never a refusal."""
    assert reasoning.wanted(None, ws(), gr(think=True, thinking_budget=31999, thinking_optional=True)) is None
    assert reasoning.wanted(None, ws(), gr(reasoning_effort="high", thinking_optional=True)) is None
    assert reasoning.wanted(DS, ws(reasoning_budget_max=10), gr(think=True, thinking_budget=31999,
                                                                thinking_optional=True)) == \
        reasoning.Thinking(True, 10, None)
    with pytest.raises(RequestRejected, match="not a level"):  # a level the model lacks is still a 400
        reasoning.wanted(DS, ws(), gr(reasoning_effort="huge", thinking_optional=True))
