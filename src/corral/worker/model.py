"""Loading a GGUF model into a llama.cpp context, and the per-model helpers the engine needs.

This is the only module of the worker that calls llama.cpp's loader; it turns every
way a load can go wrong into ``ModelLoadError`` with a reason a person understands
("no such file", "not a GGUF file: bad magic b'PK\\x03\\x04'", ...), so the process
wrapper can answer ``LoadFailed(reason)``.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

import llama_cpp as ll
import msgspec

from corral import wire

from corral.model import reasoning_format
from corral.fit.rows import outputs_max
from corral.fit.layout import GGUFError, ModelLayout, read_layout
from corral.fit.plan import has_side_context, placement
from corral.fit.split import split_weights
from corral.worker.fit import FitLoadError, fit_gpus, fit_host_ctx, fit_slots, split_gpus
from corral.worker.host.devices import host_available_bytes, list_devices, logged_buffers, offload_devices
from corral.worker.llama_context import ContextFailed, context_params, model_params, open_context
from corral.worker.llama_context import buffer_lines as _buffer_lines
from corral.worker.llama_context import init_backend as _init_backend
from corral.worker.llama_context import log_lines as _log_lines

__all__ = ["ModelLoadError", "LoadedModel", "load_model", "check_gguf_file", "rss_bytes"]

GGUF_MAGIC = b"GGUF"



class ModelLoadError(Exception):
    """The model could not be loaded; ``str(exc)`` is the reason for ``LoadFailed``."""


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_gguf_file(path: str) -> None:
    """Raise ``ModelLoadError`` unless ``path`` is a readable file that starts like a GGUF."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        raise ModelLoadError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ModelLoadError(f"is a directory, not a model file: {path}") from None
    except PermissionError:
        raise ModelLoadError(f"permission denied reading {path}") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(head) < 8:
        raise ModelLoadError(f"not a GGUF file: {path} is only {len(head)} bytes long")
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file: bad magic {head[:4]!r} in {path}")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ModelLoadError(f"unsupported GGUF version {version} in {path}")


@dataclass
class LoadedModel:
    """A model, its vocabulary and one context sized for all slots."""

    model: ll.llama_model_p
    ctx: ll.llama_context_p
    vocab: ll.llama_vocab_p
    memory: ll.llama_memory_t
    n_ctx: int
    n_ctx_slot: int
    n_slots: int
    n_batch: int
    threads: int
    threads_batch: int
    n_vocab: int
    n_swa: int  # 0 without a window, or with swa_full (every cell kept)
    embedding: bool
    pooling: int
    add_bos: bool
    info: wire.ModelInfo
    extra_contexts: list[ll.llama_context_p] = field(default_factory=list)  # on the same weights (embed/context.py)

    def meta(self, key: str) -> str | None:
        return model_meta(self.model, key)

    def set_threads(self, n: int) -> None:
        """Threads for the next decodes: the configured ones, or ``n`` when fewer cores are free."""
        t, tb = (self.threads, self.threads_batch) if n >= self.threads else (n, min(n, self.threads_batch))
        ll.llama_set_n_threads(self.ctx, t, tb)

    def free(self) -> None:
        while self.extra_contexts:
            ll.llama_free(self.extra_contexts.pop())
        free_context_and_model(self)


class _ContextAndModel(Protocol):
    ctx: ll.llama_context_p
    model: ll.llama_model_p


def free_context_and_model(holder: _ContextAndModel) -> None:
    """Free ``holder``'s context, then its model (each once: set to None after)."""
    if holder.ctx:
        ll.llama_free(holder.ctx)
        holder.ctx = None  # type: ignore[assignment]
    if holder.model:
        ll.llama_model_free(holder.model)
        holder.model = None  # type: ignore[assignment]


def model_meta(model: ll.llama_model_p, key: str) -> str | None:
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8", "replace")
        size = n + 1


def tokenizer_info(vocab: ll.llama_vocab_p, chat_template: str | None) -> wire.TokenizerInfo:
    """The vocabulary's special tokens as text and its BOS/EOS rule (GET /tokenizer_info)."""
    def text(token: int) -> str:
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
        return buf.raw[:max(n, 0)].decode("utf-8", "replace")

    return wire.TokenizerInfo(
        bos_token=text(ll.llama_vocab_bos(vocab)), eos_token=text(ll.llama_vocab_eos(vocab)),
        eot_token=text(ll.llama_vocab_eot(vocab)), pad_token=text(ll.llama_vocab_pad(vocab)),
        add_bos=bool(ll.llama_vocab_get_add_bos(vocab)), add_eos=bool(ll.llama_vocab_get_add_eos(vocab)),
        chat_template=chat_template)


def load_model(s: wire.WorkerSettings) -> LoadedModel:
    """Load ``s.model_path`` and create one context with ``s.n_parallel`` sequences."""
    t0 = time.perf_counter()
    if s.n_batch < 1:
        raise ModelLoadError(f"n_batch must be at least 1, got {s.n_batch}")
    check_gguf_file(s.model_path)
    _init_backend(s.verbose)
    _log_lines.clear()
    _buffer_lines.clear()

    devices = list_devices()
    gpus = split_gpus(devices)
    if s.tensor_split and gpus and len(s.tensor_split) > len(gpus):
        raise ModelLoadError(f"tensor_split has {len(s.tensor_split)} entries but this instance sees "
                             f"{len(gpus)} GPU(s) ({', '.join(d.name for d in gpus)}): give one per GPU of devices")
    try:
        layout: ModelLayout | None = read_layout(s.model_path).kv_sized(s.swa_full).on_devices(gpus)
    except (GGUFError, OSError, ValueError):
        layout = None  # llama.cpp may still load it; no plan or placement then
    s, slot_plan = fit_slots(s, devices, layout)  # n_parallel = "auto": from the memory left after the weights
    n_slots = s.slots_asked() or 1
    if s.ctx_len < n_slots * 16:
        raise ModelLoadError(f"ctx_len {s.ctx_len} is too small for {n_slots} slots")
    plan: wire.FitPlan | None = None
    if s.n_gpu_layers == "auto":  # fitted to the GPUs; with none, the context to the host's RAM
        try:
            plan = fit_gpus(s, devices, layout)
        except FitLoadError as exc:
            raise ModelLoadError(str(exc)) from exc
        ctx = plan.ctx_len if plan is not None else fit_host_ctx(s, layout, host_available_bytes())
        if ctx != s.ctx_len:
            s = msgspec.structs.replace(s, ctx_len=ctx)
    n_gpu_layers = s.n_gpu_layers if isinstance(s.n_gpu_layers, int) else (plan.n_gpu_layers if plan else 0)
    mparams = model_params(n_gpu_layers)
    # the split the plan was made with (else the model's own): kept alive until the load returns
    weights = plan.tensor_split if plan is not None else split_weights(len(gpus), s.tensor_split)
    split = (ctypes.c_float * max(len(weights), ll.llama_max_devices()))(*weights) if weights else None
    if split is not None:
        mparams.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
    model = ll.llama_model_load_from_file(s.model_path.encode(), mparams)
    if not model:
        detail = "; ".join(line for line in _log_lines if line)[-500:]
        raise ModelLoadError(
            f"llama.cpp could not load {s.model_path}" + (f": {detail}" if detail else "")
        )
    if not s.embedding and (s.pooling == "rank" or (s.pooling is None and _gguf_pooling(model) == _RANK)):
        s = msgspec.structs.replace(s, embedding=True)  # a reranker: it only embeds
    try:
        loaded = _make_context(s, model, t0, gpu_layers=n_gpu_layers, devices=devices, plan=plan)
    except BaseException:
        ll.llama_model_free(model)
        raise
    buffers = logged_buffers(_buffer_lines)
    parts = [] if layout is None else _placement(s, layout, loaded, offload_devices(devices), weights, n_gpu_layers)
    # the KV cache llama.cpp logged allocating; else the one computed for the placement
    kv_bytes = sum(b.bytes for b in buffers if b.kind == "kv") or sum(p.kv_bytes for p in parts)
    loaded.info = msgspec.structs.replace(loaded.info, placement=parts, buffers=buffers, kv_bytes=kv_bytes,
                                          slot_plan=slot_plan)
    return loaded


_RANK = 4  # LLAMA_POOLING_TYPE_RANK
_POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
_POOLING_NAMES = {v: k for k, v in _POOLING.items()}


def _gguf_pooling(model: ll.llama_model_p) -> int | None:
    """The file's ``{arch}.pooling_type``, if it says."""
    value = model_meta(model, f"{model_meta(model, 'general.architecture')}.pooling_type")
    return int(value) if value is not None and value.isdigit() else None


def _placement(s: wire.WorkerSettings, layout: ModelLayout, m: LoadedModel, offload: list[wire.DeviceInfo],
               weights: list[float] | None, n_gpu_layers: int) -> list[wire.DevicePlacement]:
    """Where the layers and KV went (``ModelInfo.placement``), with the context's real
    size and micro-batch."""
    return placement(layout, gpus=offload, weights=weights, ngl=n_gpu_layers, ctx=ll.llama_n_ctx_seq(m.ctx) * m.n_slots,
                     n_slots=m.n_slots, n_ubatch=ll.llama_n_ubatch(m.ctx), cache_types=(s.cache_type_k, s.cache_type_v),
                     outputs=outputs_max(s, m.n_slots), side=has_side_context(s))


def _make_context(s: wire.WorkerSettings, model: ll.llama_model_p, t0: float, *, gpu_layers: int,
                  devices: list[wire.DeviceInfo], plan: wire.FitPlan | None) -> LoadedModel:
    n_slots = s.slots_asked() or 1  # resolved by load_model
    n_ctx_slot = s.ctx_len // n_slots
    n_ctx_train = ll.llama_model_n_ctx_train(model)
    if n_ctx_train > 0:
        n_ctx_slot = min(n_ctx_slot, n_ctx_train)
    n_ctx = n_ctx_slot * n_slots
    n_batch = max(s.n_batch, n_slots)  # every generating slot needs a place in each batch
    if s.embedding:
        # Pooled embeddings need a whole input in one micro-batch.
        n_batch = max(n_batch, n_ctx_slot)
    threads = s.threads or len(os.sched_getaffinity(0)) or 1
    threads_batch = s.threads_batch or threads

    if s.cache_type_k != s.cache_type_v and model_meta(model, f"{model_meta(model, 'general.architecture')}"
                                                              ".attention.key_length_mla") is not None:
        raise ModelLoadError(f"this model uses MLA attention (one cache for K and V): cache_type_k "
                             f"({s.cache_type_k}) and cache_type_v ({s.cache_type_v}) must be the same")

    def make(pooling: int) -> ll.llama_context_p:
        # one KV stream per slot: attention only over its own cells; with speculation one
        # unified cache, whose batches split in order (worker/speculation/speculator.py: sliding windows).
        # Like llama-server: sliding-window layers keep only n_swa + n_ubatch cells per
        # slot (the C default keeps all) unless swa_full. Prefix reuse checks what is there.
        p = context_params(s, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch if s.embedding else min(n_batch, 512),
                           n_seq_max=n_slots, threads=threads, threads_batch=threads_batch,
                           n_outputs_max=outputs_max(s, n_slots), embeddings=s.embedding, pooling_type=pooling,
                           kv_unified=s.speculative != "off", swa_full=s.swa_full)
        kept = [line for line in _buffer_lines if " model buffer size" in line]  # a second context: its own
        _buffer_lines.clear()
        _buffer_lines.extend(kept)
        try:
            return open_context(model, p)[0]  # its buffers stay in _buffer_lines, beside the weights'
        except ContextFailed as exc:
            raise ModelLoadError(f"llama.cpp could not create a context of {n_ctx} cells: {exc}") from None

    ctx = make(_POOLING[s.pooling] if s.pooling is not None and s.embedding else ll.LLAMA_POOLING_TYPE_UNSPECIFIED)
    pooling = ll.llama_pooling_type(ctx)
    if s.embedding and pooling == ll.LLAMA_POOLING_TYPE_NONE and s.pooling is None:
        # A generative model has no pooling of its own: mean-pool its hidden states.
        ll.llama_free(ctx)
        ctx = make(ll.LLAMA_POOLING_TYPE_MEAN)
        pooling = ll.llama_pooling_type(ctx)

    vocab = ll.llama_model_get_vocab(model)
    n_swa = 0 if s.swa_full else ll.llama_model_n_swa(model)  # the window the cache drops cells behind
    desc = ctypes.create_string_buffer(256)
    ll.llama_model_desc(model, desc, 256)
    model_bytes = int(ll.llama_model_size(model))
    template = s.chat_template or model_meta(model, "tokenizer.chat_template")
    has_template = template is not None
    fmt = reasoning_format.resolve(s.reasoning_format, template) if not s.embedding else None
    info = wire.ModelInfo(
        description=desc.value.decode("utf-8", "replace"),
        n_params=int(ll.llama_model_n_params(model)),
        n_vocab=ll.llama_vocab_n_tokens(vocab),
        n_ctx_train=n_ctx_train,
        n_ctx=n_ctx,
        n_ctx_slot=n_ctx_slot,
        n_slots=n_slots,
        n_embd=ll.llama_model_n_embd(model),
        embedding=s.embedding,
        has_chat_template=has_template,
        reasoning_format=fmt.name if fmt is not None else "none",
        model_bytes=model_bytes,
        kv_bytes=0,  # set by load_model: llama.cpp's logged size, else the placement's
        rss_bytes=rss_bytes(),
        gpu_layers=gpu_layers,
        load_ms=(time.perf_counter() - t0) * 1000.0,
        devices=devices,
        fit=plan,
        tokenizer=tokenizer_info(vocab, template or None),
        pooling=_POOLING_NAMES.get(pooling, "") if s.embedding else (s.pooling or "mean"),
        fim=all(f(vocab) >= 0 for f in (ll.llama_vocab_fim_pre, ll.llama_vocab_fim_suf, ll.llama_vocab_fim_mid)),
    )
    return LoadedModel(
        model=model,
        ctx=ctx,
        vocab=vocab,
        memory=ll.llama_get_memory(ctx),
        n_ctx=n_ctx,
        n_ctx_slot=n_ctx_slot,
        n_slots=n_slots,
        n_batch=n_batch,
        threads=threads,
        threads_batch=threads_batch,
        n_vocab=info.n_vocab,
        n_swa=n_swa,
        embedding=s.embedding,
        pooling=pooling,
        add_bos=bool(ll.llama_vocab_get_add_bos(vocab)),
        info=info,
    )
