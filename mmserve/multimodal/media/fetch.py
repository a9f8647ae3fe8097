"""Media fetching against SSRF: URLs, hosts, addresses and files checked against a
``MediaFetchPolicy`` (``media.policy``) before and while fetching.

Every http(s) hop is checked (scheme, userinfo, domain allow-list); its host is resolved once, every
address must pass :func:`address_refusal`, and the connection goes to that checked address (Host
header and TLS SNI keep the name), so DNS rebinding cannot slip in a second answer. Clients see one
uniform message whatever went wrong; the reason goes to the server log only
(``media.errors``). Data URLs and local files are read by ``media.offline``.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from mmserve.multimodal.media.errors import (
    FetchRefused,
    fetch_failure,
    shown_source,
    too_large,
)
from mmserve.multimodal.media.limits import MediaTooLargeError
from mmserve.multimodal.media.offline import OfflineMediaReader
from mmserve.multimodal.media.policy import MediaFetchPolicy, MediaKind, address_refusal

Resolver = Callable[[str, int], Awaitable[list[str]]]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_URL_CHARS = 8192


def is_http_url(source: str) -> bool:
    return source[:8].lower().startswith(("http://", "https://"))


class MediaFetcher:
    """Loads media (data URLs, http(s) URLs, local files) under a :class:`MediaFetchPolicy`.

    Invariants: a connection is only opened to an address that passed :func:`address_refusal`
    for the hop's host, resolved exactly once per hop; at most ``max_concurrent_fetches`` fetches
    run at once on the shared client; every failure is a :class:`MediaFetchError`
    with a uniform message per media kind, except size limits (:class:`ImageTooLargeError`,
    :class:`VideoTooLargeError`). The shared async
    client belongs to the first event loop that fetches; :meth:`load_blocking` uses its own.
    """

    def __init__(
        self,
        policy: MediaFetchPolicy,
        *,
        resolver: Resolver | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.policy = policy
        self.offline_reader = OfflineMediaReader(policy)
        self.resolver: Resolver = resolver or self._system_resolve
        self._transport = transport
        self._dns_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="media-dns")
        self._client: httpx.AsyncClient | None = None
        self._semaphore = asyncio.Semaphore(policy.max_concurrent_fetches)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def load(self, source: str, kind: MediaKind = "image") -> bytes:
        """The bytes behind a data URL, http(s) URL, file:// URL or plain local path."""
        if is_http_url(source):
            return await self.fetch(source, kind)
        return await asyncio.to_thread(self.read_offline, source, kind)

    async def fetch(self, url: str, kind: MediaKind = "image") -> bytes:
        """GET an http(s) URL under the policy (addresses, redirects, size, time)."""
        loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("MediaFetcher is closed")
        if self._client is None:
            self._client, self._loop = self._new_client(), loop
        elif self._loop is not loop:
            raise RuntimeError("MediaFetcher is bound to another event loop; use load_blocking()")
        return await self._guarded_fetch(url, self._client, self._semaphore, kind)

    def load_blocking(self, source: str, kind: MediaKind = "image") -> bytes:
        """Same as :meth:`load` for synchronous callers, with or without a running loop here:
        data URLs and local files are read right here, fetches get a client of their own."""
        if not is_http_url(source):
            return self.read_offline(source, kind)
        if self._closed:
            raise RuntimeError("MediaFetcher is closed")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._fetch_private(source, kind))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="media-load") as pool:
            return pool.submit(lambda: asyncio.run(self._fetch_private(source, kind))).result()

    def read_offline(self, source: str, kind: MediaKind = "image") -> bytes:
        """Blocking: a data URL or an allowed local file (never the network)."""
        return self.offline_reader.read(source, kind)

    async def aclose(self) -> None:
        self._closed = True
        if self._client is not None:
            await self._client.aclose()
        self._dns_pool.shutdown(wait=False, cancel_futures=True)

    async def _fetch_private(self, url: str, kind: MediaKind) -> bytes:
        async with self._new_client() as client:
            no_slot = contextlib.nullcontext()  # blocking callers are bounded by their threads
            return await self._guarded_fetch(url, client, no_slot, kind)

    def _new_client(self) -> httpx.AsyncClient:
        p = self.policy
        timeout = httpx.Timeout(p.read_timeout_s, connect=p.connect_timeout_s)  # read, write, pool
        # no keep-alive: pooled connections are keyed by IP, not by the SNI host name
        limits = httpx.Limits(max_connections=p.max_concurrent_fetches, max_keepalive_connections=0)
        no_cookies = http.cookiejar.CookieJar(
            http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
        )
        # trust_env=False: no proxy or netrc from the environment
        return httpx.AsyncClient(
            transport=self._transport, trust_env=False, cookies=no_cookies, timeout=timeout,
            limits=limits,
        )  # fmt: skip

    async def _guarded_fetch(
        self, url: str, client: httpx.AsyncClient, slot: Any, kind: MediaKind
    ) -> bytes:
        """The whole fetch, slot wait included, under the total deadline; uniform failures."""
        try:
            coro = self._fetch_hops(url, client, slot, kind)
            return await asyncio.wait_for(coro, self.policy.total_timeout_s)
        except MediaTooLargeError:
            raise
        except (asyncio.TimeoutError, TimeoutError):
            timeout = f"total timeout of {self.policy.total_timeout_s} s"
            raise fetch_failure(url, timeout, kind=kind) from None
        except Exception as exc:  # refusal, DNS, connect, TLS, protocol, bad URL: all look alike
            raise fetch_failure(url, exc, kind=kind) from None

    async def _fetch_hops(
        self, url: str, client: httpx.AsyncClient, slot: Any, kind: MediaKind
    ) -> bytes:
        if len(url) > MAX_URL_CHARS:  # parsing a huge URL would stall the event loop
            raise FetchRefused(f"URL longer than {MAX_URL_CHARS} characters")
        async with slot:
            current = httpx.URL(url)
            for _ in range(self.policy.max_redirects + 1):
                response = await self._send_checked(current, client)
                try:
                    status, location = response.status_code, response.headers.get("location")
                    if status in _REDIRECTS and location:
                        if len(location) > MAX_URL_CHARS:
                            raise FetchRefused(f"redirect longer than {MAX_URL_CHARS} characters")
                        current = current.join(location)
                        continue
                    if status != 200:
                        raise FetchRefused(f"{current} answered HTTP {status}")
                    return await self._read_body(response, url, kind)
                finally:
                    await response.aclose()
            raise FetchRefused(f"more than {self.policy.max_redirects} redirects")

    async def _send_checked(self, url: httpx.URL, client: httpx.AsyncClient) -> httpx.Response:
        """Check one hop, then send it to the checked address with the original Host and SNI."""
        if url.scheme not in ("http", "https") or url.userinfo or not url.raw_host:
            raise FetchRefused(f"scheme, userinfo or host of {url} not allowed")
        host = url.raw_host.decode("ascii")
        domains = self.policy.allowed_domains
        names = {h.lower().removesuffix(".") for h in (host, url.host)}
        if domains is not None and not names & domains:
            raise FetchRefused(f"host {host!r} not in allowed domains")
        try:
            addresses = [ipaddress.ip_address(url.host)]
        except ValueError:
            port = url.port or (443 if url.scheme == "https" else 80)
            answers = await self.resolver(host, port)
            addresses = list(dict.fromkeys(ipaddress.ip_address(a) for a in answers))
        if not addresses:
            raise FetchRefused(f"no address for {host!r}")
        for ip in addresses:
            if (reason := address_refusal(ip, self.policy)) is not None:
                raise FetchRefused(f"address of {host!r} refused: {reason}")
        headers = {"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"}
        extensions = {"sni_hostname": host} if url.scheme == "https" else {}
        for i, ip in enumerate(addresses, 1):  # refused or timed out: the next checked address
            target = url.copy_with(host=str(getattr(ip, "ipv4_mapped", None) or ip))
            request = client.build_request("GET", target, headers=headers, extensions=extensions)
            try:
                return await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if i == len(addresses):
                    raise
        raise AssertionError("unreachable")

    async def _read_body(self, response: httpx.Response, url: str, kind: MediaKind) -> bytes:
        limit = self.policy.byte_limit(kind)
        too_large_error = too_large(kind, f"at {shown_source(url)} exceeds {limit} bytes")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):  # no decompression bombs: raw bytes only
            raise FetchRefused(f"unrequested Content-Encoding {encoding!r}")
        length = response.headers.get("content-length", "").strip()
        if length.isdigit() and int(length) > limit:
            raise too_large_error
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():  # identity only, checked above
            size += len(chunk)
            if size > limit:
                raise too_large_error
            chunks.append(chunk)
        return b"".join(chunks)

    async def _system_resolve(self, host: str, port: int) -> list[str]:
        """getaddrinfo on the fetcher's own small thread pool, not asyncio's default one."""
        infos = await asyncio.get_running_loop().run_in_executor(
            self._dns_pool, lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        )
        return [str(info[4][0]) for info in infos]
