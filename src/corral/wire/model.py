"""What a worker reports about the model it loaded (``Ready.info``; ``GET /models``).
Re-exported by ``corral.wire`` (import it from there). Imports only the wire's gpu, lora and
editors topics."""

from __future__ import annotations

import msgspec

from corral.wire.editors import TokenizerInfo
from corral.wire.gpu import BufferSize, DeviceInfo, DevicePlacement, FitPlan
from corral.wire.lora import LoraAdapterInfo

__all__ = ["ModelInfo", "DraftInfo", "SlotPlan"]


class SlotPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How many slots a model got and why (``corral.fit.slots.plan_slots``): the number set
    (``n_parallel = N``), or with ``"auto"`` as many as the memory left after the weights
    holds, each with its whole context, within ``n_parallel_max``."""

    n_slots: int
    asked: str  # "auto", or the n_parallel set ("8")
    slot_ctx: int  # KV cells a slot asked for (capped at n_ctx_train), before the fit to memory
    slot_bytes: int  # one slot's KV at slot_ctx (auto; 0 when set)
    budget_bytes: int  # memory left for KV after the weights and compute on ``where`` (auto; 0 when set)
    where: str  # the memory planned in: GPU names ("CUDA0"), "host", or "" (set)
    reason: str  # in words


class DraftInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The draft model of ``speculative = "draft"`` (worker/speculation/draft.py): counted in its
    ModelInfo's ``model_bytes`` and ``kv_bytes`` too."""

    path: str
    description: str
    n_params: int
    model_bytes: int  # its weights
    kv_bytes: int  # its context's KV cache
    gpu_layers: int
    n_ctx: int
    buffers: list[BufferSize] = []  # its weights' and context's buffers, as llama.cpp logged them


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    description: str  # llama_model_desc, e.g. "gemma3 270M Q4_K - Medium"
    n_params: int
    n_vocab: int
    n_ctx_train: int
    n_ctx: int  # total KV cells
    n_ctx_slot: int  # per slot
    n_slots: int
    n_embd: int
    embedding: bool
    has_chat_template: bool
    reasoning_format: str = "none"  # the thinking markup it splits (corral.model.reasoning_format)
    model_bytes: int  # llama_model_size: weights
    kv_bytes: int  # KV cache (+ compute buffers where known)
    rss_bytes: int  # process resident memory after load
    gpu_layers: int
    load_ms: float
    devices: list[DeviceInfo] = []  # what the worker sees (free memory as at the load)
    fit: FitPlan | None = None  # n_gpu_layers = "auto": the plan it loaded with
    placement: list[DevicePlacement] = []  # where its layers and KV are: each GPU holding any, then the host
    buffers: list[BufferSize] = []  # what llama.cpp allocated where, as it logged it
    tokenizer: TokenizerInfo | None = None  # special tokens and the chat template (/tokenizer_info, /props)
    pooling: str = ""  # the embedding context's pooling (none|mean|cls|last|rank); "" without one
    fim: bool = False  # the vocabulary has prefix, suffix and middle FIM tokens (infill works)
    vision: bool = False  # a projector is loaded: messages and prompts may carry images
    audio: bool = False  # its projector has an audio encoder: they may carry recordings (16 kHz WAV)
    mmproj_bytes: int = 0  # the projector file's size (held in memory beside the weights); 0 without one
    mmproj_device: str = ""  # the backend libmtmd runs it on ("CLIP using Vulkan0 backend"; "CPU")
    mmproj_buffers: list[BufferSize] = []  # its compute buffers, as libmtmd logged them
    slot_plan: SlotPlan | None = None  # how many slots it got and why (fit/slots.py)
    draft: DraftInfo | None = None  # speculative = "draft": the draft model (its bytes are in the two above)
    lora: list[LoraAdapterInfo] = []  # the LoRA adapters loaded (their bytes are in model_bytes)
