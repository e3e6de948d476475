"""Unit tests of the incremental UTF-8 decoder and the stop-string holdback (no model)."""

from __future__ import annotations

from corral.worker.output.detokenize import StopMatcher, Utf8Stream


def test_utf8_split_mid_character() -> None:
    data = "日本語 ok 🎉!".encode()
    for cut in range(1, len(data)):
        s = Utf8Stream()
        a = s.push(data[:cut])
        b = s.push(data[cut:])
        assert a + b + s.flush() == "日本語 ok 🎉!"
        assert "\ufffd" not in a + b


def test_utf8_byte_by_byte_holds_incomplete() -> None:
    s = Utf8Stream()
    emoji = "🎉".encode()
    assert [s.push(emoji[i : i + 1]) for i in range(4)] == ["", "", "", "🎉"]


def test_utf8_incomplete_at_end_becomes_replacement() -> None:
    s = Utf8Stream()
    assert s.push(b"a\xe3\x81") == "a"
    assert s.flush() == "\ufffd"


def test_utf8_invalid_byte_replaced() -> None:
    s = Utf8Stream()
    assert s.push(b"a\xffb") == "a\ufffdb"


def test_stop_never_leaks_when_split_across_pushes() -> None:
    m = StopMatcher(["</end>"])
    out = [m.push(p) for p in ["Hello <", "/e", "nd", "> more"]]
    assert "".join(out) == "Hello "
    assert m.stopped
    assert out[0] == "Hello "  # "<" held back
    assert m.push("anything") == ""


def test_stop_prefix_released_when_it_does_not_complete() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("a ST") == "a "
    assert m.push("OP") == ""
    assert m.stopped

    m = StopMatcher(["STOP"])
    assert m.push("a ST") == "a "
    assert m.push("ART") == "START"
    assert not m.stopped


def test_stop_held_text_flushed_at_end() -> None:
    m = StopMatcher(["\n\n"])
    assert m.push("line\n") == "line"
    assert m.flush() == "\n"


def test_stop_earliest_of_several() -> None:
    m = StopMatcher(["world", "lo w"])
    assert m.push("hello world") == "hel"


def test_stop_inside_one_push() -> None:
    m = StopMatcher(["."])
    assert m.push("Hi. There") == "Hi"
    assert m.stopped


def test_no_stops_passes_through() -> None:
    m = StopMatcher(["", ""])
    assert m.push("abc") == "abc"
    assert m.flush() == ""


def test_stop_matcher_names_the_stop_string_that_ended_the_text() -> None:
    m = StopMatcher(["END", ", "])
    assert m.push("one") == "one" and m.matched is None
    assert m.push(" two, three") == " two" and m.stopped and m.matched == ", "
    first = StopMatcher(["xyz", "y"])
    assert first.push("axyz") == "a" and first.matched == "xyz"  # the earliest match wins
    assert StopMatcher(["END"]).matched is None
