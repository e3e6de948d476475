"""The relay corral does not use, kept to measure against: the actor holds the worker's
socketpair and relays frames, Ray method calls in and a streaming generator out."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from corral import wire
from corral.control.transport.local import LocalSpawner


class RelayHost:
    def __init__(self, settings_json: str) -> None:
        settings = msgspec.json.decode(settings_json, type=wire.WorkerSettings)
        # started as the router starts one (the log directory is spawn()'s; output is dropped)
        self.proc, self.sock = LocalSpawner(Path(tempfile.gettempdir())).spawn_process(
            settings, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.sock.setblocking(False)

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def frames(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 1 << 16)
            if not data:
                return
            yield data

    def __del__(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, AttributeError):
            pass


class ActorWriter:
    """StreamWriter-like: each write is one ``send`` call on the actor (in order)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def write(self, data: bytes) -> None:
        self.actor.send.remote(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


def _register() -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_register()
