"""llama-server's slot actions, per model (``?model=``; left out when the key sees one model):

    POST /slots/{id_slot}?action=save     {"filename": "a.bin"} -> id_slot, filename, n_saved, n_written, timings.save_ms
    POST /slots/{id_slot}?action=restore  {"filename": "a.bin"} -> id_slot, filename, n_restored, n_read, timings.restore_ms
    POST /slots/{id_slot}?action=erase                          -> id_slot, n_erased

Slot ids are numbered across the model's running instances as ``GET /slots`` numbers them.
Files live in ``slots/`` under the server's state dir (``[server] state_dir``); a filename
is a bare name (``wire.filename_problem``: no separator, no ``..``, no leading dot), so
nothing is read or written anywhere else. The worker does the work between its steps
(``corral.worker.cache.slot_files``: llama-server's file format plus a sidecar that ties it to
the model and KV settings), deferring it while the slot is busy, as llama-server does.
Errors as llama-server gives them: "Invalid action", "Invalid slot ID", "Invalid filename",
"Unable to restore slot: ..." (400), "Unable to save slot" (500: the server's disk, never a path).
A filename is at most ``corral.wire.slots.MAX_FILENAME_BYTES`` (200), so the worker's temporary names fit
in NAME_MAX.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from corral import wire
from corral.api.core.schemas import parse_body
from corral.api.http import json_response, plane_of
from corral.api.llamacpp.schemas import model_for
from corral.control.instance.instance import Instance
from corral.control.plane import ControlPlane
from corral.control.transport.link import LinkClosed
from corral.state.paths import private_dir, state_dir
from corral.errors import InternalError, InvalidRequest

__all__ = ["router", "slots_dir"]

router = APIRouter()

_VERBS: dict[str, wire.SlotFileVerb] = {"save": "save", "restore": "restore", "erase": "erase"}


def slots_dir(plane: ControlPlane) -> Path:
    """Where slot files live: ``slots/`` in the server's state dir."""
    try:
        return private_dir(state_dir(plane.config.server.state_dir)) / "slots"  # the worker makes it 0700
    except OSError as exc:  # the reason, never the path
        raise InternalError(f"Unable to save slot: the state dir cannot be made ({exc.strerror})") from None


def _target(plane: ControlPlane, model: str, id_slot: int) -> tuple[Instance, int]:
    """The instance and its own slot index that serve global slot ``id_slot``."""
    at = 0
    for inst in plane.pool(model).instances:
        if inst.info is None or inst.ready_link is None:
            continue
        if id_slot < at + inst.info.n_slots:
            return inst, id_slot - at
        at += inst.info.n_slots
    raise InvalidRequest("Invalid slot ID" + ("" if at else f" ({model} is not loaded: it has no slots)"),
                         param="id_slot")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    filename: Any = None  # checked below, in llama-server's words


async def _filename(request: Request) -> str:
    name = (await parse_body(request, _Body, empty_ok=True)).filename
    if not isinstance(name, str) or wire.filename_problem(name) is not None:
        why = wire.filename_problem(name) if isinstance(name, str) else "filename: a string is required"
        raise InvalidRequest(f"Invalid filename ({why})", param="filename")
    return name


@router.post("/slots/{id_slot}")
async def slot_action(request: Request, id_slot: str, action: str = "", model: str | None = None) -> Response:
    verb = _VERBS.get(action)
    if verb is None:
        raise InvalidRequest("Invalid action (save, restore or erase)", param="action")
    try:
        index = int(id_slot)
    except ValueError:
        raise InvalidRequest("Invalid slot ID", param="id_slot") from None
    if index < 0:
        raise InvalidRequest("Invalid slot ID", param="id_slot")
    plane = plane_of(request)
    name = model_for(plane, model)
    filename = "" if action == "erase" else await _filename(request)
    inst, local = _target(plane, name, index)
    msg = wire.SlotFileAction(id="slot-" + secrets.token_hex(8), action=verb, slot=local,
                              directory=str(slots_dir(plane)) if filename else "", filename=filename)
    link = inst.ready_link
    try:
        if link is None:
            raise LinkClosed("stopped")
        done = await link.slot_file(msg)
    except LinkClosed:
        raise InvalidRequest("Invalid slot ID (its instance stopped)", param="id_slot") from None
    if done.error == "server":
        raise InternalError(done.message or "Unable to save slot")
    if done.error:
        raise InvalidRequest(done.message, param="filename" if done.error == "invalid_file" else "id_slot")
    if action == "erase":
        return json_response({"id_slot": index, "n_erased": done.n_tokens})
    if action == "save":
        return json_response({"id_slot": index, "filename": filename, "n_saved": done.n_tokens,
                              "n_written": done.n_bytes, "timings": {"save_ms": done.ms}})
    return json_response({"id_slot": index, "filename": filename, "n_restored": done.n_tokens,
                          "n_read": done.n_bytes, "timings": {"restore_ms": done.ms}})
