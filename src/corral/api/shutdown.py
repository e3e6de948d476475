"""Stopping ``corral serve`` (SIGINT, SIGTERM) while requests run.

uvicorn stops accepting connections, lets the running requests go on for its
``timeout_graceful_shutdown`` and then cancels them: a non-streamed request still running
got uvicorn's plain-text 500, a stream was cut off. ``Server`` gives them ``[server]
shutdown_timeout_s`` to finish, then ends every request still running or queued with a 503
``Unavailable`` (``ControlPlane.end_requests``): a non-streamed one is answered in its API's
shape, a stream ends with its error event, as for any error after it began. uvicorn's own
deadline comes ``ANSWER_S`` later: the time those answers have to be written. Then the
lifespan stops the workers (``ControlPlane.close``).
"""

from __future__ import annotations

import asyncio
import math
import socket

import uvicorn
from fastapi import FastAPI

from corral.config.file import CorralConfig
from corral.errors import Unavailable

__all__ = ["ANSWER_S", "Server", "serve"]

ANSWER_S = 5.0


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._grace_s = grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self._grace_s, self._end_requests)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _end_requests(self) -> None:
        plane = getattr(self._app.state, "router", None)  # None: the lifespan never started
        if plane is not None:
            plane.end_requests(Unavailable("the server is shutting down; try again later", retry_after_s=5))


def serve(app: FastAPI, cfg: CorralConfig, *, log_level: str, http: type[asyncio.Protocol]) -> None:
    """``uvicorn.run``, with the shutdown above."""
    grace = cfg.server.shutdown_timeout_s
    config = uvicorn.Config(app, host=cfg.server.host, port=cfg.server.port, log_level=log_level,
                            access_log=False, timeout_graceful_shutdown=math.ceil(grace + ANSWER_S), http=http)
    Server(config, app, grace).run()
