"""Catalog resolution, thread split, prefix matching: pure functions."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

from corral.control.catalog import Catalog, ModelSpec, default_threads
from corral.control.scheduling.pool import common_prefix_len
from corral.errors import ModelNotFound


def test_resolve_by_id_alias_and_gguf_suffix() -> None:
    cat = Catalog([ModelSpec(id="llama-3.2-1b", path=Path("/m.gguf"), aliases=("small",)),
                   ModelSpec(id="other", path=Path("/o.gguf"))])
    assert cat.resolve_id("small") == "llama-3.2-1b"
    assert cat.resolve_id("llama-3.2-1b.gguf") == "llama-3.2-1b"
    with pytest.raises(ModelNotFound):
        cat.resolve_id("nope")
    cat.put(ModelSpec(id="llama-3.2-1b", path=Path("/m.gguf"), aliases=("tiny",)))
    assert cat.resolve_id("tiny") == "llama-3.2-1b"
    with pytest.raises(ModelNotFound):
        cat.resolve_id("small")  # the old alias went with the old spec
    cat.remove("llama-3.2-1b")
    with pytest.raises(ModelNotFound):
        cat.resolve_id("tiny")


@pytest.mark.parametrize(("cores", "instances", "max_loaded", "n_models", "want"), [
    (2, 1, 4, 1, 2),   # one model alone gets every core
    (2, 2, 4, 1, 1),   # two workers of one model: one core each
    (2, 1, 4, 3, 1),   # several models may decode together: never more threads than cores
    (16, 2, 2, 5, 4),
    (1, 4, 4, 4, 1),   # at least one
])
def test_default_threads_divide_the_cores(cores: int, instances: int, max_loaded: int,
                                          n_models: int, want: int) -> None:
    spec = ModelSpec(id="m", path=Path("/m.gguf"), instances=instances)
    with mock.patch("os.sched_getaffinity", return_value=set(range(cores))):
        assert default_threads(spec, max_loaded, n_models, adaptive=False) == want


@pytest.mark.parametrize(("instances", "n_models"), [(1, 1), (2, 1), (1, 3)])
def test_adaptive_workers_get_every_core(instances: int, n_models: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec(id="m", path=Path("/m.gguf"), instances=instances)
    with mock.patch("os.sched_getaffinity", return_value=set(range(4))):
        assert default_threads(spec, 4, n_models, adaptive=True) == 4
        monkeypatch.setenv("CORRAL_ADAPTIVE_THREADS", "1")
        assert default_threads(spec, 4, n_models) == (4 if sys.platform == "linux" else 4 // (instances * n_models))
        monkeypatch.setenv("CORRAL_ADAPTIVE_THREADS", "0")
        assert default_threads(spec, 4, n_models) == 4 // (instances * n_models)


def test_common_prefix_len() -> None:
    assert common_prefix_len("abcdef", "abcxyz") == 3
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len("same", "same") == 4
    assert common_prefix_len("a" * 5000 + "b", "a" * 5000 + "c") == 5000
