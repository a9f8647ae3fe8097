"""``HTTPPolicy``: who may call the server, what one request may ask, whether the page is
served. Free of FastAPI and torch, so ``serve --help`` and flag errors stay fast."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmserve.entrypoints.openai.limits import RequestLimits

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def ui_default(host: str) -> bool:
    """The playground page is on by default only for a server bound to a loopback address."""
    return host.strip("[]").lower() in LOOPBACK_HOSTS


@dataclass(frozen=True)
class HTTPPolicy:
    """Who may call the server and what one request may ask (from the ``serve`` flags)."""

    api_key: str | None = None
    public_metrics: bool = False
    allowed_hosts: tuple[str, ...] = ()  # empty: any Host header
    allowed_origins: tuple[str, ...] = ()  # empty: no CORS headers at all
    limits: RequestLimits = field(default_factory=RequestLimits)
    ui: bool = False  # serve the playground page at /
