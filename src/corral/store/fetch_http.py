"""The download child's HTTP requests (HEAD for the size, GET for the bytes), with the
address policy of a URL a client named (corral.store.address_policy,
``allow_private_pull_urls``):

- each hop's host is resolved once and checked; the connection goes to the checked address
  itself (the URL's host stays the ``Host`` header and the TLS server name, so certificates
  are checked against it): a second DNS answer cannot move it (no DNS rebinding);
- redirects are followed by hand, at most ``MAX_REDIRECTS``, each target checked the same way;
- credentials (the URL's ``user:password``, an ``Authorization`` header) go only to the
  origin they were given for: a redirect to another scheme, host or port drops them;
- no proxy from the environment, no cookies.

A Hugging Face Hub file (``HF_ENDPOINT``, the operator's) is fetched with ``policy=None``:
redirects followed by httpx, which drops ``Authorization`` across origins itself.
httpx is imported in the child only (by the caller, passed in as ``client``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from corral.store.address_policy import PrivateSetting, allowed_address, resolve_addresses
from corral.store.fetch_errors import Fail, Retryable
from corral.store.redaction import redact_url

__all__ = ["MAX_REDIRECTS", "open_url"]

MAX_REDIRECTS = 5


def _origin(url: Any) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def _checked_address(url: Any, policy: PrivateSetting) -> str:
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        addrs = resolve_addresses(url.host, port)
    except (OSError, UnicodeError) as exc:
        raise Retryable(f"cannot resolve {url.host!r}: {exc}") from exc
    ip = allowed_address(addrs, policy)
    if ip is None:
        shown = ", ".join(sorted({str(a) for a in addrs}))
        raise Fail("forbidden", f"the pull URL's host {url.host!r} is {shown}, a loopback, link-local or "
                   "private address; corral does not pull from there (allow_private_pull_urls)")
    return str(ip)


def _url(httpx: Any, url: str) -> Any:
    try:
        return httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:  # e.g. 0177.0.0.1, which httpx refuses
        raise Fail("invalid", f"{redact_url(url)!r} is not a valid URL ({exc})") from None


@contextlib.contextmanager
def open_url(client: Any, method: str, url: str, headers: dict[str, str],
             policy: PrivateSetting | None) -> Iterator[Any]:
    """The response (streamed) to ``method url`` after redirects; ``policy`` None: unguarded."""
    if policy is None:
        with client.stream(method, url, headers=headers, follow_redirects=True) as resp:
            yield resp
        return
    import httpx

    first = _url(httpx, url)
    for _hop in range(MAX_REDIRECTS + 1):
        target = _url(httpx, url)
        if target.scheme not in ("http", "https") or not target.host:
            raise Fail("invalid", f"a pull URL is an http: or https: URL, not {redact_url(str(target))!r}")
        hop_headers = dict(headers)
        if _origin(target) != _origin(first):  # credentials stay with the origin they were given for
            hop_headers.pop("Authorization", None)
            target = target.copy_with(username=None, password=None)
        addr = _checked_address(target, policy)
        hop_headers["Host"] = target.netloc.decode("ascii").rpartition("@")[2]  # host[:port], IPv6 in brackets
        ext = {"sni_hostname": target.host} if target.scheme == "https" else {}
        req = client.build_request(method, target.copy_with(host=addr), headers=hop_headers, extensions=ext)
        resp = client.send(req, stream=True, follow_redirects=False)
        try:
            if resp.is_redirect and "location" in resp.headers:
                url = str(target.join(resp.headers["location"]))
                continue
            yield resp
            return
        finally:
            resp.close()
    raise Fail("invalid", f"the pull URL redirected more than {MAX_REDIRECTS} times")
