"""Where the router may connect when a client names a URL: one policy for image URLs
(``allow_private_image_urls``, corral.api.core.image_fetch) and pull URLs
(``allow_private_pull_urls``, corral.store.fetch_http in the download child).

An address is allowed when it is globally routable (not loopback, link-local, private,
shared, reserved, unspecified such as ``0.0.0.0`` and ``::``, nor multicast), or when the
setting is ``true``, or when a network listed in it holds the address. An IPv6 address that
carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, NAT64
``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo) is judged by the IPv4 address as well. Numeric
spellings of a host (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) are judged by
what the resolver makes of them: the caller checks the addresses ``getaddrinfo`` returns and
then connects to the checked address itself (so a second DNS answer cannot move it).

Imports only the standard library: the download child uses it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from typing import Union

__all__ = ["Address", "Network", "PrivateSetting", "address_allowed", "allowed_address", "resolve_addresses",
           "parse_setting"]

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
PrivateSetting = Union[bool, Sequence[Network]]  # the setting: true (any address), or networks allowed

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V4_COMPAT = ipaddress.IPv6Network("::/96")


def _carried_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (and could reach through a translator)."""
    out = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        out += list(ip.teredo)
    if ip in _NAT64 or (ip in _V4_COMPAT and int(ip) > 1):
        out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


def _public(ip: Address) -> bool:
    return ip.is_global and not ip.is_multicast and not ip.is_unspecified


def address_allowed(ip: Address, private: PrivateSetting) -> bool:
    """Whether the router may connect to ``ip`` for a client (``private``: the setting)."""
    if private is True:
        return True
    nets: Sequence[Network] = () if isinstance(private, bool) else private
    judged: list[Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        carried = _carried_ipv4(ip)
        if ip.ipv4_mapped is not None:
            judged = list(carried)  # ::ffff:a.b.c.d is a.b.c.d (a listed IPv4 network holds it)
        else:
            judged += carried
    return all(_public(a) or any(a in net for net in nets if a.version == net.version) for a in judged)


def allowed_address(addrs: Sequence[Address], private: PrivateSetting) -> Address | None:
    """The first of a host's addresses the policy allows (None: none is)."""
    return next((a for a in addrs if address_allowed(a, private)), None)


def resolve_addresses(host: str, port: int) -> list[Address]:
    """The addresses ``host`` resolves to (blocking: the download child's; image_fetch asks the
    event loop's resolver). Raises OSError / UnicodeError when it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def parse_setting(value: bool | Sequence[str]) -> PrivateSetting:
    """The setting from its plain form (true/false, or CIDR strings), as the child gets it."""
    if isinstance(value, bool):
        return value
    return [ipaddress.ip_network(v, strict=False) for v in value]
