"""Fetching an http(s) image URL a request names, without server-side request forgery.

Only with ``[server] allow_image_urls = true`` (else 403 ``image_url_not_allowed``). Then:

- the host is resolved once; an address that is not globally routable is refused unless
  ``allow_private_image_urls`` is true or a network listed there holds it (the policy of
  corral.store.address_policy, which pull URLs share);
- the connection goes to the checked address itself (the URL's host stays the ``Host``
  header and the TLS server name, so certificates are checked against it): a second DNS
  answer cannot move it elsewhere (no DNS rebinding);
- redirects are followed by hand, at most ``_MAX_REDIRECTS``, each target checked the same way;
- the body may be at most ``max_image_bytes``, or what the request's other images leave of
  ``max_image_bytes_per_request`` (a bigger ``Content-Length`` is refused before reading, a
  longer body when it gets there: 413), the whole fetch (redirects included) at most
  ``image_url_timeout_s``;
- no proxy from the environment, no cookies, nothing but GET.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpx

from corral.errors import ImageUrlNotAllowed, InvalidImage, PayloadTooLarge
from corral.store.address_policy import PrivateSetting, allowed_address

__all__ = ["fetch_image"]

_MAX_REDIRECTS = 3


def _short(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."


async def _checked_address(url: httpx.URL, where: str, private: PrivateSetting) -> str:
    host = url.host
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidImage(f"{where}: cannot resolve the image URL's host {host!r} ({exc})", param=where) from None
    addrs = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    ip = allowed_address(addrs, private)
    if ip is not None:
        return str(ip)
    raise ImageUrlNotAllowed(
        f"{where}: the image URL's host {host!r} is {', '.join(sorted({str(a) for a in addrs}))}, a loopback, "
        "link-local or private address; the router does not fetch from there (allow_private_image_urls)",
        param=where)


async def fetch_image(url: str, where: str, *, private: PrivateSetting, max_bytes: int,
                      timeout_s: float, limit_name: str = "max_image_bytes") -> bytes:
    """The bytes at ``url`` (an http(s) URL), fetched by the rules above; ``limit_name``:
    the setting ``max_bytes`` comes from, for the 413."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _fetch(url, where, private, max_bytes, limit_name)
    except TimeoutError:
        raise InvalidImage(f"{where}: fetching the image at {_short(url)} took longer than {timeout_s:g} s "
                           "(image_url_timeout_s)", param=where) from None


async def _fetch(url: str, where: str, private: PrivateSetting, max_bytes: int,
                 limit_name: str) -> bytes:
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=None) as client:
        for _hop in range(_MAX_REDIRECTS + 1):
            try:
                target = httpx.URL(url)
            except (httpx.InvalidURL, TypeError, ValueError):
                raise InvalidImage(f"{where}: {_short(url)!r} is not a valid URL", param=where) from None
            if target.scheme not in ("http", "https") or not target.host:
                raise InvalidImage(f"{where}: image URLs are data:, http: or https: URLs, not {_short(url)!r}",
                                   param=where)
            addr = await _checked_address(target, where, private)
            host_header = target.netloc.decode("ascii").rpartition("@")[2]  # host[:port], IPv6 in brackets
            ext = {"sni_hostname": target.host} if target.scheme == "https" else {}
            try:
                async with client.stream("GET", target.copy_with(host=addr), headers={"Host": host_header},
                                         extensions=ext) as resp:
                    if resp.is_redirect and "location" in resp.headers:
                        url = str(target.join(resp.headers["location"]))
                        continue
                    if resp.status_code != 200:
                        raise InvalidImage(f"{where}: the image URL {_short(str(target))} answered HTTP "
                                           f"{resp.status_code}", param=where)
                    return await _body(resp, where, max_bytes, limit_name)
            except httpx.HTTPError as exc:
                raise InvalidImage(f"{where}: cannot fetch the image at {_short(str(target))} ({exc})",
                                   param=where) from None
    raise InvalidImage(f"{where}: the image URL redirected more than {_MAX_REDIRECTS} times", param=where)


async def _body(resp: httpx.Response, where: str, max_bytes: int, limit_name: str) -> bytes:
    too_big = PayloadTooLarge(f"{where}: the image at the URL is larger than {max_bytes} bytes ({limit_name})",
                              param=where)
    length = resp.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise too_big
    out = bytearray()
    async for chunk in resp.aiter_bytes():
        out += chunk
        if len(out) > max_bytes:
            raise too_big
    return bytes(out)
