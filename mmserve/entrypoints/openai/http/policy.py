"""``HTTPPolicy``: who may call the server, what one request may ask, whether the page is
served. Free of FastAPI and torch, so ``serve --help`` and flag errors stay fast."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from mmserve.entrypoints.openai.http.limits import RequestLimits


def ui_default(host: str) -> bool:
    """The playground page is on by default only for a server bound to a loopback address
    (``localhost``, 127.0.0.0/8, ``::1``, IPv4-mapped loopback)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


@dataclass(frozen=True)
class HTTPPolicy:
    """Who may call the server and what one request may ask (from the ``serve`` flags)."""

    api_key: str | None = None
    public_metrics: bool = False
    allowed_hosts: tuple[str, ...] = ()  # empty: any Host header
    allowed_origins: tuple[str, ...] = ()  # empty: no CORS headers at all
    limits: RequestLimits = field(default_factory=RequestLimits)
    ui: bool = False  # serve the playground page at /
    mm_embeds: bool = False  # accept image_embeds parts (vLLM's --enable-mm-embeds)
