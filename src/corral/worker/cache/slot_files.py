"""llama-server's slot files: save a slot's KV to a file, restore it into a slot, erase a slot.

    files = SlotFiles(engine)
    replies = files.submit(wire.SlotFileAction(...))   # answered now, or deferred while the slot is busy
    replies += files.run_pending()                     # after each step: deferred ones whose slot is free

**The file** is llama-server's (``llama_state_seq_save_file``): u32 magic ``ggsq``, u32
version 3, u32 token count, the tokens (int32), then the sequence's state as
``llama_state_seq_save_file`` writes it (``kv_store.save_seq``'s bytes without the 8-byte
in-memory header ``llama_state_seq_get_data`` puts first). llama-server reads a plain
token list like ours, so a file saved here can be restored by llama-server started on the
same GGUF with the same context settings.

**The sidecar** ``.<filename>.corral`` (JSON) says what the state belongs to: the model
file (size, mtime, sha256 of its first MiB), the settings that shape the KV (context per
slot, slots, batch, KV types, flash attention, sliding window, projector, adapters), the
llama.cpp version and the prompt cache's ``corral.worker.cache.disk.model_key`` (which covers all of
those and more: ubatch, unified KV, GPU layers), plus the data file's length and sha256. A restore checks all of it
before llama.cpp sees a byte: a file for another model or other settings, a changed or
truncated file, or a file without a sidecar (llama-server's own) is refused, the slot
untouched. Writes are atomic: both files go to temp names (``O_EXCL``, ``O_NOFOLLOW``),
are fsynced, then renamed (data first: a crash in between leaves a sidecar whose sha256
does not match, so the file is refused, never misread).

Runs on the engine's thread, between steps (only that thread touches the context).
"""

from __future__ import annotations

import array
import errno
import hashlib
import json
import logging
import os
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import llama_cpp as ll
import msgspec

from corral import wire
from corral.worker.cache.disk import model_key
from corral.worker.cache.kv_store import restore_seq, save_seq

if TYPE_CHECKING:
    from corral.worker.model import LoadedModel
    from corral.worker.slots import Slot

__all__ = ["SlotFiles", "SEQ_MAGIC", "SEQ_VERSION", "SIDECAR_FORMAT"]


class Engine(Protocol):
    """What this needs of the engine (``corral.worker.engine.Engine``, a floor above): its
    settings, model and slots."""

    settings: wire.WorkerSettings
    m: LoadedModel
    slots: list[Slot]

log = logging.getLogger("corral.worker.cache.slot_files")

SEQ_MAGIC = 0x67677371  # 'ggsq', LLAMA_STATE_SEQ_MAGIC
SEQ_VERSION = 3  # LLAMA_STATE_SEQ_VERSION of the llama.cpp we build on
SIDECAR_FORMAT = "corral-slot-1"
_HEAD = struct.Struct("<III")
# llama_state_seq_get_data's buffer starts with (io_magic, seq id), which a state file has not
_IO_HEAD = struct.Struct("<Ii")
_IO_MAGIC = 0xAF143CD8
_KV_SETTINGS = ("cache_type_k", "cache_type_v", "flash_attn", "swa_full", "mmproj", "lora", "loras", "adapters")


class _Refused(Exception):
    def __init__(self, error: wire.SlotFileError, message: str) -> None:
        super().__init__(message)
        self.error: wire.SlotFileError = error
        self.message = message


def _sidecar(directory: Path, filename: str) -> Path:
    return directory / f".{filename}.corral"


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


class SlotFiles:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.pending: list[wire.SlotFileAction] = []
        self._identity: dict[str, Any] | None = None

    def submit(self, msg: wire.SlotFileAction) -> list[wire.SlotFileDone]:
        self.pending.append(msg)
        return self.run_pending()

    def run_pending(self) -> list[wire.SlotFileDone]:
        """Every queued action whose slot is free (or that names no slot), in order."""
        if not self.pending:
            return []
        out: list[wire.SlotFileDone] = []
        still: list[wire.SlotFileAction] = []
        for msg in self.pending:
            slot = self._slot(msg.slot)
            if slot is not None and slot.busy:
                still.append(msg)  # llama-server defers it until the slot is free
                continue
            out.append(self._run(msg, slot))
        self.pending = still
        return out

    def _slot(self, index: int) -> Slot | None:
        slots = self.engine.slots
        return slots[index] if 0 <= index < len(slots) else None

    def _run(self, msg: wire.SlotFileAction, slot: Slot | None) -> wire.SlotFileDone:
        t0 = time.perf_counter()
        try:
            if slot is None or self.engine.m.embedding:
                raise _Refused("invalid_slot", "Invalid slot ID")
            if msg.action == "erase":
                n = len(slot.cached)
                self._clear(slot)
                return wire.SlotFileDone(id=msg.id, action="erase", slot=msg.slot, n_tokens=n)
            problem = wire.filename_problem(msg.filename)
            if problem is not None or not msg.directory:
                raise _Refused("invalid_file", "Invalid filename")
            directory = Path(msg.directory)
            if msg.action == "save":
                n_tokens, n_bytes = self._save(slot, directory, msg.filename)
            else:
                n_tokens, n_bytes = self._restore(slot, directory, msg.filename)
        except _Refused as exc:
            return wire.SlotFileDone(id=msg.id, action=msg.action, slot=msg.slot, error=exc.error, message=exc.message)
        except Exception as exc:  # noqa: BLE001 - no slot file may crash the worker
            log.exception("slot %s of %s failed", msg.action, msg.filename)
            return wire.SlotFileDone(id=msg.id, action=msg.action, slot=msg.slot, error="server",  # logged, not sent
                                     message=f"Unable to {msg.action} slot ({type(exc).__name__})")
        return wire.SlotFileDone(id=msg.id, action=msg.action, slot=msg.slot, n_tokens=n_tokens, n_bytes=n_bytes,
                                 ms=(time.perf_counter() - t0) * 1000)

    def _clear(self, slot: Slot) -> None:
        ll.llama_memory_seq_rm(self.engine.m.memory, slot.index, -1, -1)
        slot.cached = []

    def identity(self) -> dict[str, Any]:
        """What a state file must have been saved under to be restored here."""
        if self._identity is None:
            s, m = self.engine.settings, self.engine.m
            st = os.stat(s.model_path)
            with open(s.model_path, "rb") as f:
                head = hashlib.sha256(f.read(1 << 20)).hexdigest()
            kv = {k: msgspec.to_builtins(getattr(s, k)) for k in _KV_SETTINGS if getattr(s, k, None) is not None}
            self._identity = {"model_bytes": st.st_size, "model_mtime_ns": st.st_mtime_ns, "model_head_sha256": head,
                              "n_ctx_slot": m.n_ctx_slot, "n_slots": m.n_slots, "n_batch": m.n_batch,
                              "n_swa": m.n_swa, "llama_cpp": ll.__version__, **kv,
                              "model_key": model_key(m, s)}  # the prompt cache's key: every KV setting
        return self._identity

    def _save(self, slot: Slot, directory: Path, filename: str) -> tuple[int, int]:
        tokens = list(slot.cached)
        state = save_seq(self.engine.m.ctx, slot.index)
        if len(state) >= _IO_HEAD.size and _IO_HEAD.unpack_from(state)[0] == _IO_MAGIC:
            state = state[_IO_HEAD.size:]  # the file holds what llama_state_seq_save_file writes
        data = _HEAD.pack(SEQ_MAGIC, SEQ_VERSION, len(tokens)) + array.array("i", tokens).tobytes() + state
        meta = json.dumps({"format": SIDECAR_FORMAT, "identity": self.identity(), "n_tokens": len(tokens),
                           "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                           # the adapter set the cells were computed under (worker/lora/adapters.py)
                           "lora_key": [list(x) for x in slot.lora],
                           "tenant": slot.tenant}).encode()  # whose cells: only its requests reuse them
        tag = f".{os.getpid()}.{time.monotonic_ns()}.tmp"  # at most 33 bytes (wire_slots.MAX_FILENAME_BYTES)
        tmp_data, tmp_meta = directory / f".{filename}{tag}", directory / f".{filename}.corral{tag}"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            _write_new(tmp_data, data)
            _write_new(tmp_meta, meta)
            os.replace(tmp_data, directory / filename)
            os.replace(tmp_meta, _sidecar(directory, filename))
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:  # the reason, never the path (the state dir is the server's)
            if exc.errno in (errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ):  # this file system's name rules
                raise _Refused("invalid_file", "Invalid filename (this server's file system cannot hold it)") from None
            raise _Refused("server", f"Unable to save slot: {exc.strerror or type(exc).__name__}") from None
        finally:
            for t in (tmp_data, tmp_meta):
                t.unlink(missing_ok=True)
        return len(tokens), len(data)

    def _read(self, path: Path) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            raise _Refused("invalid_file", "Unable to restore slot: no such slot file") from None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def _restore(self, slot: Slot, directory: Path, filename: str) -> tuple[int, int]:
        data = self._read(directory / filename)
        try:
            meta = json.loads(self._read(_sidecar(directory, filename)))
        except _Refused:
            raise _Refused("invalid_file", "Unable to restore slot: the file has no corral header "
                                           f"(.{filename}.corral); it was not saved by this server") from None
        except ValueError:
            raise _Refused("invalid_file", "Unable to restore slot: the file's corral header is corrupt") from None
        if not isinstance(meta, dict) or meta.get("format") != SIDECAR_FORMAT:
            raise _Refused("invalid_file", "Unable to restore slot: unknown slot file format")
        saved = meta.get("identity")
        mine = self.identity()
        if saved != mine:
            diff = sorted(k for k in set(mine) | set(saved if isinstance(saved, dict) else {})
                          if not isinstance(saved, dict) or saved.get(k) != mine.get(k))
            raise _Refused("invalid_file", "Unable to restore slot: the file was saved for another model or "
                                           f"other settings (differs in {', '.join(diff)})")
        if meta.get("bytes") != len(data) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
            raise _Refused("invalid_file", "Unable to restore slot: the file is truncated or changed (checksum)")
        if len(data) < _HEAD.size:
            raise _Refused("invalid_file", "Unable to restore slot: invalid slot save file")
        magic, version, n = _HEAD.unpack_from(data)
        end = _HEAD.size + 4 * n
        if magic != SEQ_MAGIC or version != SEQ_VERSION or end > len(data):
            raise _Refused("invalid_file", "Unable to restore slot: invalid slot save file")
        if n > self.engine.m.n_ctx_slot:
            raise _Refused("invalid_file", "Unable to restore slot: Restored prompt does not fit in the slot context")
        tokens = array.array("i", data[_HEAD.size:end]).tolist()
        if any(t < 0 or t >= self.engine.m.n_vocab for t in tokens):
            raise _Refused("invalid_file", "Unable to restore slot: Invalid tokens in slot save file")
        self._clear(slot)
        if not restore_seq(self.engine.m.ctx, slot.index, _IO_HEAD.pack(_IO_MAGIC, slot.index) + data[end:]):
            self._clear(slot)
            raise _Refused("invalid_file", "Unable to restore slot: No available space in KV cache or "
                                           "invalid slot save file")
        slot.cached = tokens
        tenant = meta.get("tenant", "")
        slot.tenant = tenant if isinstance(tenant, str) else ""  # the cells stay their tenant's (prompt-cache.md)
        slot.lora = tuple((int(i), float(v)) for i, v in meta.get("lora_key", []))
        return n, len(data)
