"""Template stop strings end only an answer that has begun (a base model's "\\nUser:"
as its first words would otherwise leave the answer empty): StopMatcher's after_text."""

from __future__ import annotations

from corral.worker.output.detokenize import StopMatcher


def feed(m: StopMatcher, pieces: list[str]) -> str:
    out = "".join(m.push(p) for p in pieces)
    return out + m.flush()


def test_a_leading_template_stop_does_not_end_the_answer() -> None:
    m = StopMatcher([], after_text=["\nUser:", "\nAssistant:"])
    assert feed(m, ["\n", "Assistant", ":", " Hello", "\n", "User", ":", " more"]) == "\nAssistant: Hello"
    assert m.stopped and m.matched == "\nUser:"


def test_white_space_is_not_an_answer() -> None:
    m = StopMatcher([], after_text=["\nUser:"])
    assert feed(m, [" ", "\nUser:", " hi"]) == " \nUser: hi"
    assert not m.stopped


def test_after_text_once_text_came_first() -> None:
    m = StopMatcher([], after_text=["\nUser:"])
    assert feed(m, [" Paris", "\nUs", "er:", " next"]) == " Paris"
    assert m.matched == "\nUser:"
    # in one piece: the answer before it, then the stop
    m = StopMatcher([], after_text=["\nUser:"])
    assert m.push("Hi\nUser: x") == "Hi" and m.stopped


def test_the_second_occurrence_in_one_piece_stops() -> None:
    m = StopMatcher([], after_text=["\nUser:"])
    assert m.push("\nUser: a\nUser: b") == "\nUser: a" and m.stopped


def test_a_clients_own_stop_ends_even_an_empty_answer() -> None:
    m = StopMatcher(["\nUser:"], after_text=["\nUser:", "\nAssistant:"])
    assert m.push("\nUser: x") == "" and m.stopped and m.matched == "\nUser:"
    m = StopMatcher(["."], after_text=["\nUser:"])
    assert feed(m, ["\nUser:", " a", "."]) == "\nUser: a" and m.matched == "."


def test_a_held_prefix_is_released_at_the_end() -> None:
    m = StopMatcher([], after_text=["\nUser:"])
    assert m.push("Hi\nUs") == "Hi"
    assert m.flush() == "\nUs"
