"""The generation routes served by ``HotRoutes`` (below Starlette's routing) answer
exactly as the routed path does: same statuses, same error bodies in each API's shape."""

from __future__ import annotations

from typing import Any

from corral.api.hot_routes import HOT_PATHS, HotRoutes
from support.harness import Harness

JSON = {"Content-Type": "application/json"}


def _hot_layer(app: Any) -> HotRoutes:
    layer = app.middleware_stack
    while layer is not None and not isinstance(layer, HotRoutes):
        layer = getattr(layer, "app", None)
    assert isinstance(layer, HotRoutes), "HotRoutes is not in the middleware stack"
    return layer


async def test_hot_paths_answer_like_the_routed_paths(harness: Harness) -> None:
    await harness.serve()
    c = harness.client
    assert (await c.get("/health")).status_code == 200  # builds the middleware stack
    hot = _hot_layer(harness.app)
    assert set(hot.endpoints) == HOT_PATHS  # every hot path found its endpoint

    bodies: list[bytes] = [b"", b"not json", b"[1]", b"{}", b'{"model": "nope", "prompt": "x"}',
                           b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}']

    async def answers() -> list[tuple[str, bytes, int, str]]:
        out = []
        for path in sorted(HOT_PATHS):
            for raw in bodies:
                r = await c.post(path, content=raw, headers=JSON)
                out.append((path, raw, r.status_code, r.text))
            r = await c.post(path, content=b"{}", headers={"Content-Type": "text/plain"})
            out.append((path, b"text/plain", r.status_code, r.text))
        return out

    fast = await answers()
    saved = dict(hot.endpoints)
    hot.endpoints.clear()  # everything now takes Starlette's routed path
    try:
        routed = await answers()
    finally:
        hot.endpoints.update(saved)
    assert all(400 <= status < 500 for _, _, status, _ in fast), fast
    assert fast == routed
