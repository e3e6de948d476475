"""A pull URL's credentials (``https://user:password@host/...``), hidden wherever a source
is shown: answers, events, logs, failure reasons, lists, the manifest. Only the download
child gets the source whole (corral.store.downloads). Imports only the standard library.
"""

from __future__ import annotations

import re

__all__ = ["redact_url"]

_URL_NETLOC = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s]*)")


def redact_url(text: str) -> str:
    """``text`` with the user and password of every URL in it replaced by ``***``."""
    def hide(m: re.Match[str]) -> str:
        netloc = m.group(2)
        return m.group(1) + ("***@" + netloc.rpartition("@")[2] if "@" in netloc else netloc)

    return _URL_NETLOC.sub(hide, text)
