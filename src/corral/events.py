"""The event bus: every state change in the router is published here once.

The same events feed GET /models/events (SSE), the logs, the metrics and the tests.
An event is ``{"event": NAME, "model": ID, ...fields}`` on the wire, as in llama.cpp's
/models/sse.

Names (``EventName``; fields beyond event/model):
    status_change      instance, old, new, pid, [reason, exit_code, node]
                       old/new are instance states: stopped, starting, ready,
                       stopping, failed; node = {id, address} of the Ray node
                       the instance runs on (only for instances on Ray)
    model_added        source            (catalog learned a model)
    model_removed
    download_started   pull_id, total, source
    download_progress  pull_id, done, total, rate_bps, eta_s
    download_finished  pull_id, path, sha256, size
    download_failed    pull_id, reason
    download_cancelled pull_id, done
    config_reloaded    added, removed, restarted, updated, [failed] (model ids)
    keys_reloaded      keys, added, removed (key names; the keys file was read again)
    keys_reload_failed reason            (the keys file is invalid; the old keys stay)
    conversation_started key, conv_id    (corral.control.conversations)
    conversation_ended key, conv_id, status, events, bytes
                                         status: finished, stopped, too_large, failed;
                                         sent once its worker requests ended (slots free)
    events_dropped     (this subscriber fell behind; older events were dropped)
    ray_status         status, address, reason
                       the Ray connection: connecting, connected, disconnected
    ray_placed         instance, node_id, node_address, hostname
                       (an instance's actor was placed on a Ray node)

Subscribers each get a bounded queue. A subscriber that falls behind loses the
oldest events and gets an ``events_dropped`` marker, so a stuck client can never
make the router's memory grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import enum
import time
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["Event", "EventBus", "EventName"]

log = logging.getLogger("corral.events")


class EventName(enum.StrEnum):
    """Every event the bus carries (compares equal to its string)."""

    STATUS_CHANGE = "status_change"
    MODEL_ADDED = "model_added"
    MODEL_REMOVED = "model_removed"
    CONFIG_RELOADED = "config_reloaded"
    DOWNLOAD_STARTED = "download_started"
    DOWNLOAD_PROGRESS = "download_progress"
    DOWNLOAD_FINISHED = "download_finished"
    DOWNLOAD_FAILED = "download_failed"
    DOWNLOAD_CANCELLED = "download_cancelled"
    KEYS_RELOADED = "keys_reloaded"  # the keys file was read again (corral.control.keys.ring)
    KEYS_RELOAD_FAILED = "keys_reload_failed"  # it was invalid: the old keys stay
    CONVERSATION_STARTED = "conversation_started"  # corral.control.conversations
    CONVERSATION_ENDED = "conversation_ended"
    EVENTS_DROPPED = "events_dropped"
    RAY_STATUS = "ray_status"  # the Ray connection: connecting, connected, disconnected (+ reason)
    RAY_PLACED = "ray_placed"  # an instance's actor was placed: node id, address, hostname


class Event(dict[str, Any]):
    """A dict with ``event`` and ``model`` keys (plus fields), and a timestamp."""

    @classmethod
    def make(cls, name: EventName, model: str | None, **fields: Any) -> "Event":
        ev = cls(event=str(name), model=model, **fields)
        ev["ts"] = time.time()
        return ev

    @property
    def name(self) -> str:
        return str(self["event"])


class EventBus:
    def __init__(self, queue_size: int = 1000) -> None:
        self._subscribers: set[asyncio.Queue[Event]] = set()
        self._queue_size = queue_size

    def publish(self, name: EventName, model: str | None, **fields: Any) -> Event:
        """Publish from the event loop thread. Never blocks."""
        ev = Event.make(name, model, **fields)
        log.info("%s %s %s", name, model, {k: v for k, v in fields.items()})
        for q in list(self._subscribers):
            if q.full():  # drop the two oldest: room for the marker and this event
                for _ in range(2):
                    with contextlib.suppress(asyncio.QueueEmpty):
                        q.get_nowait()
                q.put_nowait(Event.make(EventName.EVENTS_DROPPED, None))
            q.put_nowait(ev)
        return ev

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Event]]:
        """``async with bus.subscribe() as q: ev = await q.get()``."""
        q: asyncio.Queue[Event] = asyncio.Queue(self._queue_size)
        self._subscribers.add(q)
        try:
            yield q
        finally:
            self._subscribers.discard(q)
