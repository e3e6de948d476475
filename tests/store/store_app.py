"""A small FastAPI app around the store routes, for tests that do not need the real
router: it maps CorralError like the real app and streams the bus at /models/events."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from corral.api.manage.store import router as store_router
from corral.store.downloads import DownloadManager
from corral.events import EventBus
from corral.errors import CorralError
from corral.store.local import ModelStore


class FakeRouter:
    """Stands in for the control-plane facade: which models are loaded."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.unloaded: list[str] = []
        self.removed: list[str] = []

    def is_loaded(self, model_id: str) -> bool:
        return model_id in self.loaded

    def pool(self, model_id: str) -> str:
        return model_id  # the plane hands out its pool; here the name stands for it

    async def unload(self, pool: str) -> None:
        self.loaded.discard(pool)
        self.unloaded.append(pool)

    async def remove_model(self, model_id: str) -> None:
        assert model_id not in self.loaded, "removed while loaded"
        self.removed.append(model_id)


def make_app(store: ModelStore, bus: EventBus, router: FakeRouter, **dm_kw: object) -> FastAPI:
    app = FastAPI()
    app.state.store = store
    app.state.bus = bus
    app.state.router = router
    app.state.downloads = DownloadManager(store, bus, retry_backoff_s=0.02, **dm_kw)  # type: ignore[arg-type]

    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> JSONResponse:
        return JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers())

    @app.get("/models/events")
    async def events() -> StreamingResponse:
        async def gen():  # type: ignore[no-untyped-def]
            async with bus.subscribe() as q:
                yield ": subscribed\n\n"
                while True:
                    ev = await q.get()
                    yield f"data: {json.dumps(ev)}\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.get("/models")
    async def models() -> dict:
        return {"data": [m.to_dict() for m in store.list()]}

    app.include_router(store_router)
    return app


@contextmanager
def serve_in_thread(app: FastAPI) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1:<free port> in a thread; yields its URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:  # nothing to await across threads: poll, bounded
        if not t.is_alive():
            raise RuntimeError("uvicorn did not start")
        threading.Event().wait(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        dm: DownloadManager = app.state.downloads
        server.should_exit = True
        t.join(10)
        # the manager's children belong to the server's loop, which is gone now
        for proc in list(dm._procs.values()):
            if proc.returncode is None:
                proc.kill()
        asyncio.set_event_loop(None)
