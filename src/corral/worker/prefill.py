"""The step's batch: each generating slot's pending token (``write_pending``, the plain path;
speculation writes its drafts too), then prompt chunks: each prefilling slot's next tokens, as
many as the batch has room for after the generating slots' tokens (a long prompt takes several
steps, so it never stalls the streams that decode beside it).

On a model with a sliding window a completion's prompt is also cut where llama-server cuts it
(``prompt_cuts``): 4 + n_ubatch and 4 tokens before its end (tools/server: the context
checkpoints of llama.cpp PR 20288, made for completion tasks, not infill). llama.cpp's CPU
kernels round differently with a batch's shape, so with the same cuts a request alone gives
llama-server's greedy tokens and logprobs (measured on the embedded model: the first token's
logprob -0.9789 in one batch of 11, -1.0340 cut at 7, llama-server -1.0337; the text parts 12
tokens later); it costs a prompt one more step."""

from __future__ import annotations

import llama_cpp as ll

from corral import wire
from corral.fit.rows import ECHO_CHUNK
from corral.worker.prompt import requests
from corral.worker.sampling import sampler as sampling
from corral.worker.model import LoadedModel
from corral.worker.batch import Batch
from corral.worker.slots import LAST_CUT, Slot
from corral.worker.tokens import Tokenizer
from corral.worker.media.prompt import kv_pos, text_end

__all__ = ["EchoChunk", "cut_chunk", "fill_prompt_chunks", "prompt_cuts", "prompt_logprobs", "write_pending"]

EchoChunk = tuple[Slot, int, int, int]  # slot, batch index, prompt pos, count


def write_pending(b: Batch, slots: list[Slot]) -> tuple[int, list[tuple[Slot, int]]]:
    """Each generating slot's pending token at the batch's start (``StepFeature.write_decodes``
    when no feature writes them); the count and (slot, batch index)."""
    n = 0
    outputs: list[tuple[Slot, int]] = []
    for slot in slots:
        job = slot.job
        if job is None or slot.pending < 0:
            continue
        b.token[n] = slot.pending
        b.pos[n] = kv_pos(job.tokens, len(slot.cached))  # after M-RoPE media: less (media/prompt.py)
        b.seq[n] = slot.index
        b.logits[n] = 1
        outputs.append((slot, n))
        slot.cached.append(slot.pending)
        slot.pending = -1
        n += 1
    return n, outputs


def prompt_cuts(m: LoadedModel) -> tuple[int, ...]:
    """How many tokens before a prompt's end a chunk stops, as llama-server's prompt
    processing does on a model with a sliding window (none without one, or with swa_full)."""
    return (LAST_CUT + ll.llama_n_ubatch(m.ctx), LAST_CUT) if m.n_swa > 0 else ()


def cut_chunk(pos: int, take: int, n_prompt: int, cuts: tuple[int, ...]) -> int:
    """``take`` prompt tokens from ``pos`` on, shortened to end at a cut it would cross (a cut:
    that many tokens before the prompt's end, ``n_prompt``)."""
    for cut in cuts:
        end = n_prompt - cut
        if pos < end < pos + take:
            take = end - pos
    return take


def fill_prompt_chunks(b: Batch, slots: list[Slot], n: int, outputs: list[tuple[Slot, int]],
                       echo_chunks: list[EchoChunk]) -> int:
    """Add prompt tokens after the ``n`` already in ``b``; a slot whose prompt ends in this
    batch asks for its last token's logits (appended to ``outputs``). A chunk ends at a cut of
    its job (``Job.cuts``: that many tokens before its prompt's end) it would cross.
    Returns the new count."""
    budget = b.cap - n
    echo_room = ECHO_CHUNK  # the echo slots' logits rows this step, all together (fit.rows.outputs_max)
    for slot in slots:
        if budget <= 0:
            break
        job = slot.job
        if job is None or slot.prompt_pos >= len(job.tokens) or slot.n_gen > 0:
            continue
        toks = job.tokens
        stop = text_end(toks, slot.prompt_pos)  # the next media chunk's start: media/steps.py decodes it
        take = min(budget, stop - slot.prompt_pos)
        if take <= 0:
            continue
        take = cut_chunk(slot.prompt_pos, take, len(toks), job.cuts)
        echo = slot.echo_logprobs is not None
        if echo:
            take = min(take, echo_room)
            if take <= 0:
                continue
            echo_room -= take
            echo_chunks.append((slot, n, slot.prompt_pos, take))
        start = kv_pos(toks, len(slot.cached))  # after M-RoPE media: less (media/prompt.py)
        for k in range(take):
            b.token[n + k] = toks[slot.prompt_pos + k]
            b.pos[n + k] = start + k
            b.seq[n + k] = slot.index
            b.logits[n + k] = 1 if echo else 0
        slot.cached.extend(toks[slot.prompt_pos : slot.prompt_pos + take])
        slot.prompt_pos += take
        n += take
        budget -= take
        if slot.prompt_pos == len(toks):
            b.logits[n - 1] = 1
            outputs.append((slot, n - 1))
    return n


def prompt_logprobs(slot: Slot, at: int, pos: int, count: int, m: LoadedModel, tok: Tokenizer) -> wire.Delta | None:
    """Logprobs of the prompt tokens after each of these positions (echo, batch index ``at`` on);
    once the prompt's last has them, the echo ``Delta`` (the prompt and its logprobs)."""
    job, lps = slot.job, slot.echo_logprobs
    assert job is not None and lps is not None
    toks = job.tokens
    k = slot.logprobs or 0
    for j in range(count):
        if pos + j + 1 < len(toks):
            logits = sampling.logits_at(m.ctx, at + j, m.n_vocab)
            lps.append(sampling.token_logprobs(logits, toks[pos + j + 1], k, tok.prompt_piece))
    if pos + count < len(toks):
        return None
    slot.echo_logprobs = None
    return wire.Delta(job.req.id, requests.echo_text(tok, job.req, toks), 0, lps)
