"""One image of a request, checked in the router with Pillow before any slot is taken.

``checked_image(data, where, budget)`` returns the bytes the worker gets, or raises a
400 (``InvalidImage``) that names the image (``where``: ``messages.0.content.1``) and what
is wrong with it:

- empty, or not an image at all;
- a format outside ``ALLOWED_FORMATS`` (PNG, JPEG, WebP, GIF, BMP): Pillow is opened with
  that allow-list, so no other plugin ever parses request bytes (EPS would hand them to
  Ghostscript, TIFF and the rest are attack surface nobody asked for); the usual refused
  ones (HEIC, SVG, JPEG XL, PDF, EPS, TIFF) are named by their signature;
- more pixels than ``[server] max_image_pixels`` (a decompression bomb), or than the
  request's images may have together (``max_image_pixels_per_request``, the worker holds
  all of a request's bitmaps at once): read from the header, before anything is decoded
  (``PixelBudget``);
- truncated or corrupt: the whole image is decoded once, here.

PNG, JPEG, GIF and BMP go to the worker as they came (its decoder, stb_image in libmtmd,
reads them); WebP (and a PNG or JPEG in a mode stb_image does not read) is re-encoded as
PNG, so the worker only ever sees formats it decodes. Blocking: call it in a thread.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from corral.errors import InvalidImage

__all__ = ["ALLOWED_FORMATS", "ENGINE_FORMATS", "PixelBudget", "checked_image"]

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # the only Pillow plugins that see request bytes
ENGINE_FORMATS = frozenset({"PNG", "JPEG", "GIF", "BMP"})  # what stb_image reads (libmtmd's decoder)
_ENGINE_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I;16"})

# formats Pillow does not read, told apart from "not an image" so the message can say so
_UNSUPPORTED = ((b"<svg", "SVG"), (b"<?xml", "SVG/XML"), (b"\xff\x0a", "JPEG XL"),
                (b"\x00\x00\x00\x0cJXL ", "JPEG XL"), (b"%PDF", "PDF"), (b"%!PS", "PostScript/EPS"),
                (b"\xc5\xd0\xd3\xc6", "EPS"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))
_FTYP_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"heif": "HEIF", b"avif": "AVIF"}


def _unsupported_format(data: bytes) -> str | None:
    head = data[:64].lstrip()
    for magic, name in _UNSUPPORTED:
        if head.startswith(magic):
            return name
    if data[4:8] == b"ftyp":
        return _FTYP_BRANDS.get(data[8:12], "ISO media (" + data[8:12].decode("latin-1") + ")")
    return None


@dataclass
class PixelBudget:
    """The pixels a request's images may have: each, and all of them together."""

    per_image: int  # [server] max_image_pixels
    per_request: int  # [server] max_image_pixels_per_request
    used: int = 0

    def take(self, where: str, width: int, height: int) -> None:
        """Count one image's pixels (from its header), or refuse it before it is decoded."""
        n = width * height
        if n > self.per_image:
            raise _bomb(where, width, height, self.per_image)
        if self.used + n > self.per_request:
            raise InvalidImage(f"{where}: the request's images have more than {self.per_request} pixels together "
                               f"(this {width}x{height} one after {self.used}; max_image_pixels_per_request)",
                               param=where)
        self.used += n


def checked_image(data: bytes, where: str, budget: PixelBudget) -> bytes:
    """The image as the worker gets it, or ``InvalidImage`` naming ``where`` and the problem."""
    if not data:
        raise InvalidImage(f"{where}: the image is empty (0 bytes)", param=where)
    max_pixels = budget.per_image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit applies
            with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as im:
                width, height = im.size
                fmt = im.format or "unknown"
                budget.take(where, width, height)
                im.load()
                if fmt in ENGINE_FORMATS and im.mode in _ENGINE_MODES:
                    return data
                out = io.BytesIO()
                im.convert("RGBA" if "A" in im.getbands() else "RGB").save(out, "PNG")
                return out.getvalue()
    except Image.DecompressionBombError:
        raise InvalidImage(f"{where}: the image has more pixels than Pillow decodes (a decompression bomb); "
                           f"the most is {max_pixels} (max_image_pixels)", param=where) from None
    except UnidentifiedImageError:
        other = _unsupported_format(data)
        if other is not None:
            raise InvalidImage(f"{where}: the image format {other} is not supported; send PNG, JPEG, GIF, "
                               "BMP or WebP", param=where) from None
        raise InvalidImage(f"{where}: not an image (none of PNG, JPEG, WebP, GIF, BMP: {len(data)} bytes "
                           f"starting {data[:8].hex()})", param=where) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise InvalidImage(f"{where}: the image is truncated or corrupt ({exc})", param=where) from None


def _bomb(where: str, width: int, height: int, max_pixels: int) -> InvalidImage:
    return InvalidImage(f"{where}: the image is {width}x{height} = {width * height} pixels, more than the "
                        f"{max_pixels} allowed (max_image_pixels; a decompression bomb?)", param=where)
