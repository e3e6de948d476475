"""Files uploaded for Ollama's create (``HEAD``/``POST /api/blobs/sha256:<hex>``): GGUF
models and LoRA adapters, kept in ``models_dir/.corral/blobs/sha256-<hex>`` (owner-only).

An upload streams to a temporary file in that folder while it is hashed; only when the
bytes hash to the digest it was sent under is it renamed into place (a mismatch, a client
that leaves, a body over the limit: the temporary file goes, nothing is kept). A blob is
never listed as a model; ``/api/create`` names it by digest. Deleting the last model made
from a blob deletes the blob (``remove_unused``).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from corral.errors import InvalidRequest, PayloadTooLarge
from corral.state.paths import private_dir

__all__ = ["BlobStore", "parse_digest"]

_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")


def parse_digest(digest: str) -> str:
    """The hex of ``sha256:<64 hex>`` (Ollama's form), or InvalidRequest."""
    m = _DIGEST.match(digest.strip())
    if m is None:
        raise InvalidRequest(f"digest {digest[:80]!r}: expected sha256:<64 lowercase hex digits>", param="digest")
    return m.group(1)


class BlobStore:
    def __init__(self, models_dir: Path) -> None:
        self.root = Path(models_dir) / ".corral" / "blobs"

    def path(self, digest: str) -> Path:
        return self.root / f"sha256-{parse_digest(digest)}"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def remove_unused(self, files: Iterable[str], used: set[str]) -> list[Path]:
        """Delete those of ``files`` that are blobs here and not in ``used`` (the files every
        model still runs on): a deleted model's uploads, as Ollama prunes its layers. Returns
        what went."""
        gone = []
        for name in files:
            path = Path(name)
            if path.parent == self.root and path.name.startswith("sha256-") and name not in used:
                path.unlink(missing_ok=True)
                gone.append(path)
        return gone

    async def write(self, digest: str, chunks: AsyncIterator[bytes], *, limit: int) -> Path:
        """Keep the uploaded bytes under ``digest`` once they hash to it; returns the path."""
        hexd = parse_digest(digest)
        target = self.root / f"sha256-{hexd}"
        if target.is_file():
            async for _ in chunks:  # already here: read and drop the body
                pass
            return target
        private_dir(self.root)
        tmp = self.root / f".upload-{secrets.token_hex(8)}"
        h = hashlib.sha256()
        size = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"the blob is larger than max_upload_bytes={limit}")
                    h.update(chunk)
                    f.write(chunk)
            if h.hexdigest() != hexd:
                raise InvalidRequest(f"the uploaded bytes hash to sha256:{h.hexdigest()}, not {digest}; "
                                     "nothing was kept", param="digest")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target
