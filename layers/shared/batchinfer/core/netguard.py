"""Which addresses a webhook may reach: public ones only.

A webhook URL is chosen by a tenant and fetched from inside the deployment, so it must never reach
what only the deployment can: loopback, private networks (RFC 1918, IPv6 unique local), link-local
(169.254.0.0/16, where the EC2/ECS metadata service lives at 169.254.169.254 and 169.254.170.2),
carrier-grade NAT, multicast, reserved and unspecified addresses. `ipaddress`' `is_global` says
exactly this, for IPv4, IPv6 and IPv4 addresses mapped into IPv6. Loopback may be allowed (the local
stack's receivers, when told: `Settings.webhook_allow_loopback`).

The check runs on every address a name resolves to at the moment of connecting
(`pipeline.webhooks.GuardedResolver`), so a name that resolved to a public address at registration
and to a private one later (DNS rebinding) is refused too.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class ForbiddenAddress(ValueError):
    """A webhook host that is, or resolves to, an address only the deployment should reach."""


def forbidden(address: IpAddress, *, allow_loopback: bool = False) -> bool:
    """True when `address` is not a public one (loopback is allowed with `allow_loopback`)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return not allow_loopback
    return not address.is_global or address.is_multicast  # 224.0.0.0/4 counts as global


def literal_address(host: str) -> IpAddress | None:
    """The IP address `host` spells (brackets of an IPv6 literal removed), or None for a name.

    IPv4's older spellings count too (`0x7f000001`, `127.1`, `0177.0.0.1`): `inet_aton`, which
    `getaddrinfo` and many HTTP clients use, reads them as addresses where `ipaddress` does not.
    """
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def check_url(url: str, *, allow_loopback: bool = False) -> None:
    """Refuse a webhook URL whose host is a forbidden address literal, or `localhost`.

    Raises ForbiddenAddress. Names are checked where they are resolved (`pipeline.webhooks.GuardedResolver`).
    """
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    address = literal_address(host)
    if address is not None and forbidden(address, allow_loopback=allow_loopback):
        raise ForbiddenAddress(f"webhook host {host} is not a public address")
    if not allow_loopback and (host == "localhost" or host.endswith(".localhost")):
        raise ForbiddenAddress(f"webhook host {host} is loopback")


def safe_url(url: str) -> str:
    """`url` without its query, fragment and credentials: what logs and error messages may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # not a number: say nothing of it
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
