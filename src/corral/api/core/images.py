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
2. decodes each ``data:`` URL (base64; a payload over ``max_image_bytes`` is a 413) or fetches
   each http(s) URL (``image_fetch``: off unless allowed, no private addresses);
3. checks each image with Pillow (``image_check``: format, pixel limit, truncation);
4. checks that the text holds exactly one marker per image (a marker typed into a message
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
from corral.api.core.image_check import checked_image
from corral.api.core.image_fetch import fetch_image
from corral.api.http import plane_of
from corral.config import ServerConfig
from corral.control.capabilities import can
from corral.errors import ImageUrlNotAllowed, InvalidImage, InvalidRequest, PayloadTooLarge, VisionNotSupported

__all__ = ["ImageRef", "attach_images", "decode_data_url", "data_url"]


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of a request: its URL (``data:`` or http(s)) and the field it came from."""

    url: str
    where: str


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


async def _fetched(ref: ImageRef, srv: ServerConfig) -> bytes | None:
    """An http(s) image's bytes; None for a data: URL (decoded with the checks, in a thread)."""
    scheme = ref.url[:8].lower()
    if scheme.startswith("data:"):
        return None
    if scheme.startswith(("http://", "https://")):
        if not srv.allow_image_urls:
            raise ImageUrlNotAllowed(f"{ref.where}: this server does not fetch image URLs (allow_image_urls "
                                     "is off); send the image inline as a data: URL (base64)", param=ref.where)
        return await fetch_image(ref.url, ref.where, private=srv.allow_private_image_urls,
                                 max_bytes=srv.max_image_bytes, timeout_s=srv.image_url_timeout_s)
    raise InvalidImage(f"{ref.where}: an image URL is a data: URL (base64) or an http(s) URL", param=ref.where)


def _check_markers(messages: Sequence[wire.ChatMessage], images: list[list[bytes]]) -> None:
    for i, (m, imgs) in enumerate(zip(messages, images)):
        texts = [m.content, m.reasoning or "", *(c.arguments for c in m.tool_calls or [])]
        found = sum(t.count(wire.MEDIA_MARKER) for t in texts)
        if found != len(imgs):
            raise InvalidRequest(f"messages.{i}.content: the text contains {wire.MEDIA_MARKER!r}, which marks "
                                 "where an image goes; remove it from the text", param=f"messages.{i}.content")


async def attach_images(request: Request, model: str, requests: list[wire.GenerateRequest],
                        refs: list[list[ImageRef]]) -> list[wire.GenerateRequest]:
    """``requests`` with their images (``refs[i]``: message i's; with a raw prompt, all in
    order), each loaded and checked; the errors of the module's docstring."""
    plane = plane_of(request)
    pool = plane.pool(model)
    first = next(r for rs in refs for r in rs)
    if not can(pool, "vision"):
        raise VisionNotSupported(
            f"{first.where}: model {pool.spec.id!r} does not read images: it has no vision projector (set mmproj "
            "in its [models] table, or put its mmproj-*.gguf next to the model file)", param=first.where)
    srv = plane.config.server
    fetched = [[await _fetched(ref, srv) for ref in rs] for rs in refs]

    def check(data: bytes | None, ref: ImageRef) -> bytes:
        raw = decode_data_url(ref.url, ref.where, srv.max_image_bytes) if data is None else data
        return checked_image(raw, ref.where, srv.max_image_pixels)

    images = await asyncio.to_thread(lambda: [[check(d, ref) for d, ref in zip(ds, rs)] for ds, rs in zip(fetched, refs)])
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
