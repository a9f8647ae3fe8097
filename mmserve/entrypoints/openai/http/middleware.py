"""Pure ASGI middlewares (streaming untouched): HTTP metrics, Host allow-list, API key."""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmserve.engine.metrics.prometheus import ServerMetrics
from mmserve.entrypoints.openai.http.errors import APIError, error_response

ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/mm/encode",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/health",
    "/ping",
    "/version",
    "/metrics",
)


class HTTPMetricsMiddleware:
    """Counts responses by endpoint and status code."""

    def __init__(self, app: ASGIApp, stats: ServerMetrics) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope.get("path", "")
            self.stats.observe_http(path if path in ENDPOINTS else "other", status)


def _host_of(value: str) -> str | None:
    """``Example.com:8000`` -> ``example.com``, ``[::1]:80`` -> ``::1``; malformed -> None."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :]
        if end < 0 or (rest and not (rest[:1] == ":" and rest[1:].isdigit())):
            return None
        return value[1:end] or None
    host, _, port = value.partition(":")
    return host if host and (not port or port.isdigit()) else None


def host_allowed(host_header: str, allowed: Iterable[str]) -> bool:
    """The Host header against names like ``api.example.com``, ``*.example.com``, ``[::1]``
    or ``host:8000`` (ports are ignored); a malformed header matches nothing but ``*``."""
    host = _host_of(host_header)
    for pattern in allowed:
        pattern = pattern.strip().lower()
        if pattern == "*":
            return True
        if host is None:
            continue
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
        bare_ipv6 = pattern.count(":") > 1 and not pattern.startswith("[")
        if host == (pattern if bare_ipv6 else _host_of(pattern)):
            return True
    return False


class AllowedHostsMiddleware:
    """Refuses (400) requests whose ``Host`` header is not in ``--allowed-hosts`` (DNS rebinding
    of a browser against a server on localhost)."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str]) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            if not host_allowed(host, self.allowed_hosts):
                err = APIError(400, "invalid Host header (see --allowed-hosts)", code="bad_host")
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class APIKeyMiddleware:
    """With ``--api-key``: every path needs ``Authorization: Bearer KEY`` except ``/health``
    (and ``/metrics`` with ``--public-metrics``). Covers ``/docs`` and ``/openapi.json`` too."""

    def __init__(self, app: ASGIApp, api_key: str, public_paths: frozenset[str]) -> None:
        self.app = app
        self.key = api_key.encode()
        self.public_paths = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in self.public_paths:
            auth = Headers(scope=scope).get("authorization", "")
            scheme, _, token = auth.partition(" ")
            ok = secrets.compare_digest(token.strip().encode(), self.key)
            if scheme.lower() != "bearer" or not ok:
                err = APIError(401, "Incorrect or missing API key.", code="invalid_api_key")
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)
