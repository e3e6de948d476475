"""Typed messages between the router and a worker process: the whole contract across the
process boundary. Both sides (``corral.control`` in the router, ``corral.worker``) depend on
it and never on each other; it imports nothing else of corral but ``corral.model.settings`` and
``corral.children.frames`` (leaf modules). Import it as ``from corral import wire`` and use
``wire.GenerateRequest``: this package re-exports every type of its modules, one a topic:

    requests    GenerateRequest, EmbedRequest, TokenizeRequest, Abort (and their parts:
                ChatMessage, SamplingParams, ToolCall; the bounds check ``invalid_field``; a
                dialect's body read as SamplingParams: ``sampling_from``, ``spelled``)
    answers     Delta, Finished, RequestFailed, Embeddings, Tokenized (Usage, Timings, logprobs)
    lifecycle   WorkerSettings, Loading, Ready, LoadFailed, StatsRequest, Stats, Shutdown
    model       ModelInfo, DraftInfo (``Ready.info``)
    gpu         DeviceInfo, FitPlan, DevicePlacement, ... (what a worker reports of its GPUs)
    lora        LoraScale, LoraAdapterInfo
    editors     Infill, SlotState, TokenizerInfo (llama-server's /infill, /slots, /tokenizer_info)
    slots       SlotFileAction, SlotFileDone (llama-server's slot files)
    cache       PromptCacheDisk, PersistCache, PromptCacheStats (the prompt cache on disk)
    preempt     Preempt, Resume, Paused (fair-share preemption)
    codec       ToWorker, FromWorker, encode, decode_to_worker, decode_from_worker, FrameDecoder

A new topic's types go in a module of their own here, re-exported below and drawn in the
conversation (``tests/test_docs.py`` checks that every frame is drawn, on its side).

Transport: one ``socket.socketpair()`` per worker, created by the router; the child
end is inherited (``pass_fds``) and named with ``--fd N``. No filesystem path, no TCP
port: no other local user can reach it. EOF on the socket means the router is gone,
and the worker exits.

Framing (``corral.children.frames``, shared with the download child's channel): each message
is ``4-byte big-endian length`` + msgpack body. The body is a
tagged msgspec struct (``{"type": "<tag>", ...}``); ``decode`` returns the concrete
struct, so handlers ``match`` on the class.

Conversation (each line one frame, or a run of them; ``->`` router to worker, ``<-`` back;
words in parentheses are comments):

    router                                              worker
      | -- spawn with WorkerSettings -------------------> |  (JSON on argv)
      | <--------------------------------------- Loading  |  (its PROTOCOL_VERSION)
      | <---------------------------- Ready | LoadFailed  |  (LoadFailed: the worker exits non-zero)
      | -- GenerateRequest ------------------------------> |
      | <-------------- Delta* then Finished | RequestFailed
      | -- EmbedRequest ---------------------------------> |  (with a query: rerank scores)
      | <------------------------ Embeddings | RequestFailed
      | -- TokenizeRequest ------------------------------> |  (text, tokens, or messages to render)
      | <------------------------- Tokenized | RequestFailed
      | -- Abort ----------------------------------------> |  (by id: a running or paused request)
      | <------------------------------------- Finished   |  (reason "abort"; nothing for an unknown id)
      | -- Preempt --------------------------------------> |  (pause it between decode steps)
      | <--------------------------------------- Paused   |  (paused False: nothing paused, no slot freed)
      | -- Resume ---------------------------------------> |  (the router reserved a slot)
      | <-------------------------- Delta* then Finished  |  (where it stopped, same worker)
      | -- SlotFileAction -------------------------------> |  (save, restore, erase: deferred while busy)
      | <--------------------------------- SlotFileDone   |  (its numbers, or its error)
      | -- StatsRequest ---------------------------------> |
      | <---------------------------------------- Stats   |
      | -- PersistCache ---------------------------------> |  (no answer: prefixes to disk, then Shutdown)
      | -- Shutdown -------------------------------------> |  (the worker drains nothing, exits 0)

Details of each topic: its module's docstring (``corral.wire.cache``, ``corral.wire.preempt``,
``corral.wire.slots`` draw their own part).
"""

from __future__ import annotations

from corral.children.frames import HEADER, FrameTooLarge
from corral.wire.answers import (Delta, Embeddings, FailureCode, Finished, FinishReason, RequestFailed, Timings,
                                 TokenLogprob, Tokenized, TopLogprob, Usage)
from corral.wire.cache import PersistCache, PromptCacheDisk, PromptCacheStats
from corral.wire.codec import (MAX_FRAME, FrameDecoder, FromWorker, ToWorker, decode_from_worker, decode_to_worker,
                               encode)
from corral.wire.editors import Infill, InfillChunk, SlotState, TokenizerInfo
from corral.wire.gpu import BufferSize, DeviceInfo, DevicePlacement, DevicePlan, FitPlan, host_and_gpu_bytes
from corral.wire.lifecycle import (PROTOCOL_VERSION, Loading, LoadFailed, Ready, Shutdown, Stats, StatsRequest,
                                   WorkerSettings)
from corral.wire.lora import LoraAdapterInfo, LoraScale
from corral.wire.model import DraftInfo, ModelInfo, SlotPlan
from corral.wire.preempt import Paused, Preempt, Resume
from corral.wire.requests import (MEDIA_MARKER, Abort, ChatMessage, EmbedRequest, GenerateRequest, PromptFormat,
                                  SamplingParams, SamplingValues, TokenizeRequest, ToolCall, invalid_field, sampling_from,
                                  spelled)
from corral.wire.slots import SlotFileAction, SlotFileDone, SlotFileError, SlotFileVerb, filename_problem

__all__ = [
    "PROTOCOL_VERSION", "WorkerSettings", "ChatMessage", "ToolCall", "SamplingParams", "SamplingValues", "spelled", "sampling_from", "PromptFormat", "MEDIA_MARKER",
    "invalid_field", "GenerateRequest", "EmbedRequest", "Abort", "StatsRequest", "Shutdown",
    "Loading", "ModelInfo", "DraftInfo", "SlotPlan", "TokenizerInfo", "DeviceInfo", "DevicePlan", "DevicePlacement", "BufferSize",
    "FitPlan", "host_and_gpu_bytes", "Ready", "LoadFailed", "Delta",
    "TokenLogprob", "TopLogprob", "Usage", "Timings", "Finished", "RequestFailed", "Embeddings",
    "TokenizeRequest", "Tokenized", "Stats", "ToWorker", "FromWorker", "FinishReason",
    "FailureCode", "encode", "decode_to_worker", "decode_from_worker", "FrameDecoder",
    "FrameTooLarge", "HEADER", "MAX_FRAME", "Infill", "InfillChunk", "SlotState", "LoraScale", "LoraAdapterInfo",
    "SlotFileAction", "SlotFileDone", "SlotFileError", "SlotFileVerb", "filename_problem",
    "PersistCache", "PromptCacheDisk", "PromptCacheStats", "Preempt", "Resume", "Paused",
]
