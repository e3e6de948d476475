"""Images on the one request path: from a chat request's image parts to the worker's
``wire.ChatMessage.images`` (and ``GenerateRequest.images`` with a raw prompt).

Every dialect translates its image blocks into OpenAI ``image_url`` parts (Ollama's
``images``, Anthropic's ``image`` blocks and Responses' ``input_image`` as ``data:`` URLs, or
the http(s) URL a block names). ``ChatMessageIn`` turns each part into a
``wire.MEDIA_MARKER`` at its place in the turn's text and an ``ImageRef`` (the URL and the
field it came from). Before the request is submitted (no slot taken, no model loaded),
``attach_images``:

1. checks that the model reads images (``corral.control.capabilities``: a loaded instance
   says, else its projector): 400 ``vision_not_supported`` otherwise;
2. bounds the request's images together before any is fetched or decoded: at most
   ``max_images_per_request`` (400), and the inline ones' bytes (known from their base64)
   within ``max_image_bytes_per_request`` (413);
3. fetches each http(s) URL, one after another (``image_fetch``: off unless allowed, no
   private addresses), each within what is left of ``max_image_bytes_per_request`` (and
   ``max_image_bytes``): the stream stops at the bound (413), so 30 URLs of 19 MiB cost the
   router at most the bound, not 570 MiB;
4. decodes each ``data:`` URL (base64; a payload over ``max_image_bytes`` is a 413) and checks
   each image with Pillow, one at a time (``image_check``: the allowed formats, the pixel
   limits of one image and of the request's images together, read from each header before
   it is decoded, truncation);
5. checks that the text holds exactly one marker per image (a marker typed into a message
   would misplace every image after it: 400), and puts the bytes on the messages.

Errors name the image by its field (``messages.1.content.2``) in every dialect's shape.
"""

from __future__ import annotations

import asyncio
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from starlette.requests import Request

from corral import wire
from corral.api.core.audio import decode_recordings
from corral.api.core.image_check import PixelBudget, checked_image
from corral.api.core.image_fetch import fetch_image
from corral.api.http import plane_of
from corral.config.file import ServerConfig
from corral.control.capabilities import can
from corral.control.scheduling.pool import ModelPool
from corral.errors import (AudioNotSupported, ImageUrlNotAllowed, InvalidImage, InvalidRequest, PayloadTooLarge,
                           VisionNotSupported)

__all__ = ["ImageRef", "attach_images", "decode_data_url", "data_url"]


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image (or recording: ``audio``) of a request: its URL (``data:`` or http(s); a
    recording's is always ``data:``) and the field it came from; a recording's declared format."""

    url: str
    where: str
    audio: bool = False
    format: str | None = None


def data_url(b64: str, media_type: str = "image/*") -> str:
    """A base64 payload (Ollama's ``images``, Anthropic's base64 source) as a ``data:`` URL."""
    return f"data:{media_type};base64,{b64}"


def decode_data_url(url: str, where: str, max_bytes: int) -> bytes:
    head, comma, payload = url.partition(",")
    if not comma or not head.lower().endswith(";base64"):
        raise InvalidImage(f"{where}: a data: URL of an image must be base64 (data:image/png;base64,...)",
                           param=where)
    text = "".join(payload.split())  # clients wrap long base64 lines
    if len(text) // 4 * 3 > max_bytes + 2:
        raise PayloadTooLarge(f"{where}: the image is larger than {max_bytes} bytes (max_image_bytes)",
                              param=where)
    try:
        data = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidImage(f"{where}: the image's base64 is not valid ({exc})", param=where) from None
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"{where}: the image is larger than {max_bytes} bytes (max_image_bytes)",
                              param=where)
    return data


def _is_inline(ref: ImageRef) -> bool:
    return ref.url[:5].lower() == "data:"


def _check_totals(refs: list[ImageRef], srv: ServerConfig) -> int:
    """Refuse a request over its image bounds before anything is fetched or decoded;
    returns the bytes its inline images hold (at most: from their base64's length)."""
    if len(refs) > srv.max_images_per_request:
        where = refs[srv.max_images_per_request].where
        raise InvalidRequest(f"{where}: the request has {len(refs)} images, more than the "
                             f"{srv.max_images_per_request} allowed (max_images_per_request)", param=where)
    inline = 0
    for ref in refs:
        if _is_inline(ref):
            text = "".join(ref.url.partition(",")[2].split())
            inline += len(text) // 4 * 3 - len(text[-2:]) + len(text[-2:].rstrip("="))  # its bytes
            if inline > srv.max_image_bytes_per_request:
                raise _over_total(ref.where, srv.max_image_bytes_per_request)
    return inline


def _over_total(where: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"{where}: the request's images hold more than {limit} bytes together "
                           "(max_image_bytes_per_request)", param=where)


async def _fetched(ref: ImageRef, srv: ServerConfig, left: int) -> bytes | None:
    """An http(s) image's bytes (at most ``left``, what the request's byte bound leaves);
    None for a data: URL (decoded with the checks, in a thread)."""
    scheme = ref.url[:8].lower()
    if scheme.startswith("data:"):
        return None
    if scheme.startswith(("http://", "https://")):
        if not srv.allow_image_urls:
            raise ImageUrlNotAllowed(f"{ref.where}: this server does not fetch image URLs (allow_image_urls "
                                     "is off); send the image inline as a data: URL (base64)", param=ref.where)
        if left < srv.max_image_bytes:
            limit, name = max(left, 0), "max_image_bytes_per_request: what the request's other images leave"
        else:
            limit, name = srv.max_image_bytes, "max_image_bytes"
        return await fetch_image(ref.url, ref.where, private=srv.allow_private_image_urls,
                                 max_bytes=limit, limit_name=name, timeout_s=srv.image_url_timeout_s)
    raise InvalidImage(f"{ref.where}: an image URL is a data: URL (base64) or an http(s) URL", param=ref.where)


def _check_markers(messages: Sequence[wire.ChatMessage], images: list[list[bytes]]) -> None:
    for i, (m, imgs) in enumerate(zip(messages, images)):
        texts = [m.content, m.reasoning or "", *(c.arguments for c in m.tool_calls or [])]
        found = sum(t.count(wire.MEDIA_MARKER) for t in texts)
        if found != len(imgs):
            raise InvalidRequest(f"messages.{i}.content: the text contains {wire.MEDIA_MARKER!r}, which marks "
                                 "where an image goes; remove it from the text", param=f"messages.{i}.content")


async def attach_images(request: Request, pool: ModelPool, requests: list[wire.GenerateRequest],
                        refs: list[list[ImageRef]]) -> list[wire.GenerateRequest]:
    """``requests`` with their images and recordings (``refs[i]``: message i's; with a raw
    prompt, all in order), each loaded and checked; the errors of the module's docstring
    and of ``api/core/audio.py``. A recording goes to the worker as 16 kHz mono WAV in the
    same list as the images, at its marker."""
    plane = plane_of(request)
    srv = plane.config.server
    heard = [r for rs in refs for r in rs if r.audio]
    if heard and not can(pool, "audio"):
        raise AudioNotSupported(
            f"{heard[0].where}: model {pool.spec.id!r} does not hear audio: it has no projector with an audio "
            "encoder (set mmproj in its [models] table to one, e.g. Qwen2-Audio's or Ultravox's)",
            param=heard[0].where)
    seen = [[r for r in rs if not r.audio] for rs in refs]
    recordings = iter(await decode_recordings([(r.url, r.where, r.format) for r in heard], srv))
    pictures = await _load_images(pool, seen, srv) if any(seen) else [[] for _ in refs]
    images: list[list[bytes]] = []
    for rs, pics in zip(refs, pictures):
        it = iter(pics)
        images.append([next(recordings) if r.audio else next(it) for r in rs])
    return _attach(requests, images)


async def _load_images(pool: ModelPool, refs: list[list[ImageRef]], srv: ServerConfig) -> list[list[bytes]]:
    first = next(r for rs in refs for r in rs)
    if not can(pool, "vision"):
        raise VisionNotSupported(
            f"{first.where}: model {pool.spec.id!r} does not read images: it has no vision projector (set mmproj "
            "in its [models] table, or put its mmproj-*.gguf next to the model file)", param=first.where)
    total = srv.max_image_bytes_per_request
    used = _check_totals([r for rs in refs for r in rs], srv)
    fetched: list[list[bytes | None]] = []
    for rs in refs:  # one after another: each within what the others left
        fetched.append([])
        for ref in rs:
            data = await _fetched(ref, srv, total - used)
            fetched[-1].append(data)
            used += len(data or b"")
    budget = PixelBudget(srv.max_image_pixels, srv.max_image_pixels_per_request)

    def check(data: bytes | None, ref: ImageRef) -> bytes:
        raw = decode_data_url(ref.url, ref.where, srv.max_image_bytes) if data is None else data
        return checked_image(raw, ref.where, budget)

    return await asyncio.to_thread(lambda: [[check(d, ref) for d, ref in zip(ds, rs)] for ds, rs in zip(fetched, refs)])


def _attach(requests: list[wire.GenerateRequest], images: list[list[bytes]]) -> list[wire.GenerateRequest]:
    out = []
    for r in requests:
        if r.messages is not None:
            _check_markers(r.messages, images)
            msgs = [msgspec.structs.replace(m, images=imgs) if imgs else m for m, imgs in zip(r.messages, images)]
            out.append(msgspec.structs.replace(r, messages=msgs))
        else:
            flat = [img for imgs in images for img in imgs]
            if (r.prompt or "").count(wire.MEDIA_MARKER) != len(flat):
                raise InvalidRequest(f"prompt: holds {(r.prompt or '').count(wire.MEDIA_MARKER)} image markers "
                                     f"({wire.MEDIA_MARKER!r}) for {len(flat)} images", param="prompt")
            out.append(msgspec.structs.replace(r, images=flat))
    return out
