"""Read-only views of the control plane's state: GET /models entries, metrics snapshots."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from corral.control.placement.memory import memory_bytes
from corral import wire
from corral.control import generation_defaults
from corral.control.capabilities import can
from corral.control.instance.instance import InstanceState
from corral.control.scheduling.pool import ModelPool
from corral.control.prompt_cache import view as prompt_cache_view

__all__ = ["describe", "snapshot", "speculation"]


def speculation(stats: Any, method: str | None = None, info: wire.ModelInfo | None = None) -> dict[str, Any] | None:
    """An instance's speculative decoding counters (``wire.Stats``): draft tokens verified
    and accepted, their ratio, and tokens emitted per slot-step; with ``method`` the model's
    ``speculative`` ("ngram", "draft", "off") and, for "draft", the draft model's path
    (``info.draft``); None before a report."""
    if not isinstance(stats, wire.Stats):
        return None
    out: dict[str, Any] = {} if method is None else {"method": method}
    if info is not None and info.draft is not None:
        out["draft_model"] = info.draft.path
    return {**out, "draft_tokens": stats.spec_drafted, "accepted_tokens": stats.spec_accepted,
            "acceptance_rate": stats.spec_accepted / stats.spec_drafted if stats.spec_drafted else None,
            "tokens_per_step": stats.tokens_generated / stats.gen_steps if stats.gen_steps else None}


def snapshot(pools: Iterable[ModelPool]) -> list[dict[str, Any]]:
    """Compact state for metrics gauges."""
    out = []
    for pool in pools:
        out.append({
            "id": pool.spec.id,
            "status": pool.status(),
            "queued": len(pool.waiters),
            "preemption": pool.preempt.stats,
            "instances": [{"index": i.index, "state": i.state.value, "busy": pool.busy(i),
                           "total": i.slots_total, "memory": i.memory_bytes,
                           "node": i.placement.node_id or "local",
                           "node_address": i.placement.node_address or "",
                           "speculation": speculation(i.stats, pool.spec.speculative),
                           "prompt_cache": prompt_cache_view(i.stats)}
                          for i in pool.instances],
        })
    return out


def describe(pool: ModelPool, *, created: int, status: str | None = None) -> dict[str, Any]:
    """One model as GET /models shows it (llama.cpp router fields plus instances).
    ``status``: a variant's (``ControlPlane.status``), else the pool's own."""
    spec = pool.spec
    instances = []
    for i in pool.instances:
        rep = i.stats or i.info  # latest report: Stats, else Ready's ModelInfo
        instances.append({
            "index": i.index,
            "state": i.state.value,
            "pid": i.pid,
            "node": (None if i.placement.node_id is None else
                     {"id": i.placement.node_id, "address": i.placement.node_address}),
            # the plan says how many and why (n_parallel = "auto": from the memory left after the weights)
            "slots": {"busy": pool.busy(i), "total": i.slots_total,
                      "plan": msgspec.to_builtins(i.info.slot_plan) if i.info and i.info.slot_plan else None},
            # the context a slot got: ctx_len // n_parallel, capped at n_ctx_train, fitted to memory
            "n_ctx_slot": i.info.n_ctx_slot if i.info else None,
            "memory": {"model_bytes": rep.model_bytes if rep else None,  # a draft model's included
                       "kv_bytes": rep.kv_bytes if rep else None,
                       "mmproj_bytes": i.info.mmproj_bytes if i.info else None,  # the vision projector
                       # where libmtmd runs it ("Vulkan0", "CPU"; "" without one) and its buffers there
                       "mmproj_device": i.info.mmproj_device if i.info else None,
                       "mmproj_buffers": msgspec.to_builtins(i.info.mmproj_buffers) if i.info else [],
                       "lora": msgspec.to_builtins(i.info.lora) if i.info else [],  # the adapters, their buffers
                       "draft": msgspec.to_builtins(i.info.draft) if i.info and i.info.draft else None,
                       "rss_bytes": i.rss_bytes},
            "last_used": pool.last_used_of(i) or None,
            "threads": i.threads,
            "speculation": speculation(i.stats, spec.speculative, i.info),
            "prompt_cache": prompt_cache_view(i.stats),  # hits, misses, bytes in RAM and on disk, time saved
            "restarts": i.restarts,
            "failures": i.failures,
            "reason": i.reason,
            "exit_code": i.exit_code,
            "log": i.log_path,
            "gpu_layers": i.info.gpu_layers if i.info else None,
            "devices": [msgspec.to_builtins(d) for d in i.info.devices] if i.info else [],
            "fit": msgspec.to_builtins(i.info.fit) if i.info and i.info.fit else None,
            "placement": msgspec.to_builtins(i.info.placement) if i.info else [],
            # where admission placed it (GPU indexes, CUDA_VISIBLE_DEVICES) and its estimated need
            # there (in all, and on each of its GPUs)
            "gpu": {"devices": i.gpu.devices, "need_bytes": i.gpu.need_bytes,
                    "need_bytes_per_device": i.gpu.needs} if i.gpu else None,
        })
    status = status or pool.status()
    return {
        "id": spec.id,
        "object": "model",
        "owned_by": "corral",
        "created": created,
        "aliases": list(spec.aliases),
        "path": str(spec.path),
        "source": spec.source,
        "in_cache": spec.path.exists(),
        "vision": can(pool, "vision"),  # sees images: a projector (``mmproj``: its file)
        "audio": can(pool, "audio"),  # hears recordings: a projector with an audio encoder
        "mmproj": spec.mmproj,
        "status": {
            "value": status,
            "failed": status == "failed",
            "reason": pool.failure_reason if status == "failed" else None,
            "exit_code": next((i.exit_code for i in pool.instances if i.state is InstanceState.FAILED), None),
        },
        "settings": {"ctx_len": spec.ctx_len, "n_parallel": spec.n_parallel,
                     "n_parallel_max": spec.n_parallel_max,
                     "instances": spec.instances, "n_gpu_layers": spec.n_gpu_layers, "devices": spec.devices,
                     "threads": spec.threads, "embedding": spec.embedding,
                     "ttl_s": spec.ttl_s, "pinned": spec.pinned, "speculative": spec.speculative,
                     "draft_max": spec.draft_max, "draft_min": spec.draft_min, "swa_full": spec.swa_full},
        # what a request that sets none of them gets (control/generation_defaults.py)
        "generation": generation_defaults.in_force(spec),
        "queued": len(pool.waiters),
        "preemption": pool.preempt.stats.view(pool.preempt.paused),  # fair-share pauses (control/scheduling/preempt.py)
        "last_used": pool.last_used or None,
        "memory_bytes": memory_bytes(pool) if pool.occupies else 0,
        "instances": instances,
    }
