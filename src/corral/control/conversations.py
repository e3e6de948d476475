"""Streams that outlive their client (llama-server's ``X-Conversation-Id``): the one owner
of their buffers.

A streamed request that carries a conversation id is drained by a task of its own into a
``Conversation`` (its SSE events, as bytes, in order), so the generation goes on when the
client leaves; any number of readers follow it (``follow(from_event)``: replay, then live)
until it ends. ``Conversations`` keeps them per key (``owner``: the key's name, ``-``
without keys) and bounds them:

- at most ``max_conversations_per_key`` per key: a new one drops that key's oldest finished
  one, and is refused (429) while that many still run;
- at most ``conversation_bytes_per_key`` of events per key: the key's oldest finished ones
  are dropped to make room, and a running one that would still overflow is stopped (its
  stream ends with a ``conversation_too_large`` error event);
- a finished one is kept ``conversation_ttl_s``, then dropped.

Another key's conversation does not exist (404, the same answer as an unknown id).
``stop`` cancels the drain (the request core aborts its worker requests) and returns once
every worker request ended, so the slots are free. The state lives in the router process:
it survives a config reload (the plane is the same object) but not a restart.

Events: ``conversation_started`` and ``conversation_ended`` (key, conv_id, status:
finished | stopped | too_large | failed; events, bytes), after the slots were released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Literal

import msgspec

from corral.control.stream import RequestStream
from corral.errors import CorralError, InvalidRequest, NotFound, RateLimited
from corral.events import EventBus, EventName

if TYPE_CHECKING:
    from corral.config.file import ServerConfig

__all__ = ["Conversation", "Conversations", "check_conversation_id"]

log = logging.getLogger("corral.conversations")

Status = Literal["running", "finished", "stopped", "too_large", "failed"]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_conversation_id(value: str, param: str = "X-Conversation-Id") -> str:
    """A conversation id as a client may name one (1-128 of ``A-Za-z0-9._:-``), else a 400."""
    if not _ID.fullmatch(value):
        raise InvalidRequest(f"{param}: a conversation id is 1 to 128 letters, digits or '._:-', "
                             "starting with a letter or digit", param=param)
    return value


def _too_large_event(limit: int) -> bytes:
    body = {"error": {"message": f"the conversation's events exceed this key's {limit} bytes "
                                 "([server] conversation_bytes_per_key); the generation was stopped",
                      "type": "invalid_request_error", "param": None, "code": "conversation_too_large"}}
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


class Conversation:
    """One conversation's events and the task that produces them. Read by ``follow``."""

    __slots__ = ("owner", "conv_id", "events", "nbytes", "status", "_task", "_changed", "_requests", "_ttl")

    def __init__(self, owner: str, conv_id: str) -> None:
        self.owner = owner
        self.conv_id = conv_id
        self.events: list[bytes] = []
        self.nbytes = 0
        self.status: Status = "running"
        self._task: asyncio.Task[None] | None = None
        self._changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._requests: list[RequestStream] = []
        self._ttl: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    def _append(self, event: bytes) -> None:
        self.events.append(event)
        self.nbytes += len(event)
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.get_running_loop().create_future()
        changed.set_result(None)

    async def follow(self, from_event: int = 0) -> AsyncIterator[bytes]:
        """The events from index ``from_event`` on: those kept, then each as it comes,
        until the conversation ends. Reading changes nothing."""
        i = from_event
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if not self.running:
                return
            await asyncio.shield(self._changed)


class Conversations:
    """Every key's conversations (see the module's docstring): ``start``, ``get``, ``stop``."""

    def __init__(self, settings: Callable[[], ServerConfig], bus: EventBus) -> None:
        self._settings = settings
        self._bus = bus
        self._by_key: dict[tuple[str, str], Conversation] = {}  # (owner, conv_id), oldest first

    def _of(self, owner: str) -> list[Conversation]:
        return [c for (o, _), c in self._by_key.items() if o == owner]

    def check(self, owner: str, conv_id: str) -> None:
        """Whether ``owner`` may start ``conv_id`` now (a 400 or 429 if not); drops nothing."""
        old = self._by_key.get((owner, conv_id))
        if old is not None and old.running:
            raise InvalidRequest(f"conversation {conv_id!r} is still generating; DELETE /v1/stream?conv_id= "
                                 "stops it", param="X-Conversation-Id")
        limit = self._settings().max_conversations_per_key
        mine = [c for c in self._of(owner) if c.conv_id != conv_id]
        if len(mine) >= limit and all(c.running for c in mine):
            raise RateLimited(f"this key already has {limit} conversations generating "
                              "([server] max_conversations_per_key); stop one or wait for one to end",
                              retry_after_s=1.0, kind="conversations")

    def start(self, owner: str, conv_id: str, source: AsyncIterator[bytes],
              requests: list[RequestStream]) -> Conversation:
        """Drain ``source`` (an SSE body whose worker requests are ``requests``) into a new
        conversation, replacing a finished one of the same id. Raises as ``check`` does."""
        self.check(owner, conv_id)
        self._drop((owner, conv_id))
        mine = self._of(owner)
        finished = [c for c in mine if not c.running]
        while len(mine) >= self._settings().max_conversations_per_key and finished:
            old = finished.pop(0)  # the oldest finished one makes room
            mine.remove(old)
            self._drop((owner, old.conv_id))
        conv = Conversation(owner, conv_id)
        conv._requests = requests
        self._by_key[(owner, conv_id)] = conv
        conv._task = asyncio.get_running_loop().create_task(self._drain(conv, source),
                                                            name=f"conversation {conv_id}")
        self._bus.publish(EventName.CONVERSATION_STARTED, requests[0].model if requests else None,
                          key=owner, conv_id=conv_id)
        return conv

    def get(self, owner: str, conv_id: str) -> Conversation:
        """``owner``'s conversation ``conv_id`` (another key's is a 404, as an unknown id)."""
        conv = self._by_key.get((owner, conv_id))
        if conv is None:
            raise NotFound(f"no conversation {conv_id!r}", param="conv_id")
        return conv

    async def stop(self, owner: str, conv_id: str) -> Conversation:
        """Stop ``owner``'s conversation (its generation ends, its slots are free when this
        returns); it stays readable until its TTL. Harmless on a finished one."""
        conv = self.get(owner, conv_id)
        task = conv._task
        if task is not None and not task.done():
            conv.status = "stopped"
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        return conv

    def close(self) -> None:
        """The router stops: every drain is cancelled (the plane stops the workers)."""
        for conv in list(self._by_key.values()):
            if conv._task is not None:
                conv._task.cancel()
            if conv._ttl is not None:
                conv._ttl.cancel()
        self._by_key.clear()

    def _drop(self, key: tuple[str, str]) -> None:
        conv = self._by_key.pop(key, None)
        if conv is not None and conv._ttl is not None:
            conv._ttl.cancel()

    def _room(self, conv: Conversation, need: int) -> bool:
        """Whether ``need`` more bytes fit ``conv``'s key, dropping its oldest finished ones."""
        limit = self._settings().conversation_bytes_per_key
        mine = self._of(conv.owner)
        used = sum(c.nbytes for c in mine)
        for old in mine:
            if used + need <= limit:
                break
            if not old.running:
                used -= old.nbytes
                self._drop((old.owner, old.conv_id))
        return used + need <= limit

    async def _drain(self, conv: Conversation, source: AsyncIterator[bytes]) -> None:
        status: Status = "finished"
        try:
            async for event in source:
                if not self._room(conv, len(event)):
                    status = "too_large"
                    break
                conv._append(event)
        except asyncio.CancelledError:
            status = "stopped"
        except CorralError as exc:  # the route's generator turns errors into events; not expected
            log.warning("conversation %s ended with %s", conv.conv_id, exc.message)
            status = "failed"
        except Exception:  # noqa: BLE001 - never an unretrieved task exception
            log.exception("conversation %s failed", conv.conv_id)
            status = "failed"
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()  # the request core aborts what still runs
            for r in conv._requests:  # until the worker answered every abort: the slots are free
                r.abort()  # harmless when done; a generator left suspended aborts nothing
                with contextlib.suppress(Exception):
                    await r.wait_done()
        if status == "too_large":
            conv.events.append(_too_large_event(self._settings().conversation_bytes_per_key))
            conv.events.append(b"data: [DONE]\n\n")
        conv.status = status
        conv._wake()
        if self._by_key.get((conv.owner, conv.conv_id)) is conv:
            conv._ttl = asyncio.get_running_loop().call_later(
                self._settings().conversation_ttl_s, self._expire, conv)
        self._bus.publish(EventName.CONVERSATION_ENDED, conv._requests[0].model if conv._requests else None,
                          key=conv.owner, conv_id=conv.conv_id, status=status, events=len(conv.events),
                          bytes=conv.nbytes)

    def _expire(self, conv: Conversation) -> None:
        if self._by_key.get((conv.owner, conv.conv_id)) is conv:
            del self._by_key[(conv.owner, conv.conv_id)]
