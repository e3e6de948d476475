"""Fixtures of the editor and RAG tests: small GGUF models made offline, once per session
(testkit/gguf_models.py): the embedded Gemma with FIM tokens, a tiny BERT reranker."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fixtures import harness  # noqa: F401 - the fixture, shared
from testkit.gguf_models import write_fim_model, write_reranker
from worker.conftest import engine  # noqa: F401 - the embedded Gemma in-process (no FIM tokens)


@pytest.fixture(scope="session")
def fim_model_path(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    return write_fim_model(model_path, tmp_path_factory.mktemp("gguf") / "gemma-fim.gguf")


@pytest.fixture(scope="session")
def fim_plain_model_path(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    """FIM prefix, suffix and middle tokens, no repository or file-separator tokens."""
    return write_fim_model(model_path, tmp_path_factory.mktemp("gguf") / "gemma-fim-plain.gguf", repo_level=False)


@pytest.fixture(scope="session")
def reranker_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reranker(tmp_path_factory.mktemp("gguf") / "tiny-reranker.gguf")
