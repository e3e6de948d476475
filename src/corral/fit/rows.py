"""How many logits rows a batch of the model's context may ask for (``n_outputs_max``).

llama.cpp sizes a context's compute buffer for that many rows of logits, by default a whole
micro-batch (Gemma 3's 262,144-entry vocabulary at 512 rows: 512 MiB), and aborts a batch
that asks for more. The engine asks for a token a slot, a verifying batch's drafts with
speculation, and ``ECHO_CHUNK`` prompt rows for the slots that want their prompts' logprobs
(``prefill.fill_prompt_chunks`` shares them among those slots each step).

Neutral (imports only ``settings``): the worker sizes its context with it, and
``gpu_fit`` estimates the compute buffer's logits with the same rows (router and worker).
"""

from __future__ import annotations

from corral.model.settings import ModelSettings

__all__ = ["ECHO_CHUNK", "outputs_max"]

ECHO_CHUNK = 32  # prompt tokens a step whose logits are asked for (echo + logprobs), all slots together


def outputs_max(s: ModelSettings, n_slots: int) -> int:
    """The logits rows a batch may ask for, which llama.cpp sizes the compute buffer by (its
    default: a whole micro-batch; Gemma 3's 262,144-entry vocabulary at 512 rows is 512 MiB)
    and aborts beyond: a token a slot, a verifying batch's drafts with speculation, and
    ``ECHO_CHUNK`` prompt tokens of the slots whose prompt logprobs are asked for (prefill.py
    keeps them to that). 0 (the default) for an embedding model."""
    return 0 if s.embedding else n_slots * (1 + (s.draft_max if s.speculative != "off" else 0)) + ECHO_CHUNK
