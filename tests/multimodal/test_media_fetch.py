"""MediaFetcher's SSRF policy, against real loopback servers that record every connection.

Nothing here may leave the machine: an autouse guard records (and blocks) any socket connect to
a non-loopback address and any name resolution that is not numeric or ``localhost``; "public"
hosts are answered in-process by an injected transport that refuses every address it does not
expect.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import ipaddress
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from PIL import Image

from mmserve.multimodal.media import errors as media_fetch_errors
from mmserve.multimodal.media import offline as offline_media
from mmserve.multimodal.media.errors import MediaFetchError
from mmserve.multimodal.media.fetch import MediaFetcher, Resolver
from mmserve.multimodal.media.limits import ImageTooLargeError
from mmserve.multimodal.media.policy import (
    CLOUD_METADATA_ADDRESSES,
    MediaFetchPolicy,
    address_refusal,
)

LOOPBACK = ("127.0.0.1", "::1")
LOCAL_NET = MediaFetchPolicy.parse_networks("127.0.0.1/32")
PUBLIC_IP = "93.184.215.14"  # only ever answered in-process by FakeInternet


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 30, 60)).save(buf, format="PNG")
    return buf.getvalue()


PNG = _png()


# ---------------------------------------------------------------- network guard


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Block and record connects to non-loopback addresses and non-local name lookups."""
    violations: list[str] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(address: object) -> None:
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            violations.append(f"connect {address!r}")
            raise ConnectionRefusedError("blocked by the test guard")

    def connect(self: socket.socket, address: object) -> None:
        check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: object) -> int:
        check(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = host.decode() if isinstance(host, bytes) else host
        if name == "localhost":  # answered here: never depends on /etc/hosts or DNS
            tcp = socket.SOCK_STREAM, socket.IPPROTO_TCP, ""
            return [
                (socket.AF_INET, *tcp, ("127.0.0.1", port)),
                (socket.AF_INET6, *tcp, ("::1", port, 0, 0)),
            ]
        if name is not None:
            try:
                real_getaddrinfo(name, None, flags=socket.AI_NUMERICHOST)
            except socket.gaierror:
                violations.append(f"resolve {host!r}")
                raise socket.gaierror(socket.EAI_NONAME, "blocked by the test guard") from None
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield violations
    assert violations == [], violations


# ---------------------------------------------------------------- loopback servers


class RecordingServer(http.server.ThreadingHTTPServer):
    """HTTP server on 127.0.0.1 that records every accepted connection and request."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.stop = threading.Event()
        self.reset()

    def server_bind(self) -> None:  # skip HTTPServer's getfqdn(): no reverse lookup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def reset(self) -> None:
        self.connections = 0
        self.requests: list[tuple[str, str | None]] = []  # (path, Host header)
        self.drip_started, self.client_gone = threading.Event(), threading.Event()
        self.stream: dict[str, int | bool] = {}
        self.stream_done = threading.Event()

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        self.connections += 1
        super().process_request(request, client_address)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: RecordingServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.flush()

    def do_GET(self) -> None:
        srv = self.server
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        srv.requests.append((parts.path, self.headers.get("Host")))
        if parts.path == "/png":
            self._head(200, {"Content-Type": "image/png", "Content-Length": str(len(PNG))})
            self.wfile.write(PNG)
        elif parts.path == "/redirect":
            self._head(int(query.get("code", "302")), {"Location": query["to"]})
        elif parts.path.startswith("/loop/"):
            hop = int(parts.path.rsplit("/", 1)[1])
            self._head(302, {"Location": f"/loop/{hop + 1}"})
        elif parts.path == "/stream":  # no Content-Length: the body ends when we close
            total, sent, aborted = int(query["total"]), 0, False
            self._head(200, {"Content-Type": "image/png"})
            try:
                while sent < total:
                    self.wfile.write(b"\0" * 65536)
                    sent += 65536
            except OSError:
                aborted = True
            srv.stream.update(sent=sent, total=total, aborted=aborted)
            srv.stream_done.set()
        elif parts.path == "/biglen":  # announces 1 GB, sends nothing, waits for the close
            self._head(200, {"Content-Type": "image/png", "Content-Length": str(10**9)})
            self.connection.settimeout(5)
            try:
                if self.connection.recv(1) == b"":
                    srv.client_gone.set()
            except OSError:
                srv.client_gone.set()
        elif parts.path == "/drip":  # one byte every 0.2 s
            self._head(200, {"Content-Type": "image/png"})
            srv.drip_started.set()
            try:
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    if srv.stop.wait(0.2):
                        break
            except OSError:
                srv.client_gone.set()
        elif parts.path == "/stall":  # accepts, then never answers (until teardown)
            srv.stop.wait(3)
        else:
            self._head(404, {"Content-Length": "0"})


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[RecordingServer, RecordingServer]]:
    pair = (RecordingServer(), RecordingServer())
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in pair]
    for thread in threads:
        thread.start()
    yield pair
    for srv in pair:
        srv.stop.set()
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def origin(servers: tuple[RecordingServer, RecordingServer]) -> RecordingServer:
    """A legitimate image server (only reachable when the policy allows 127.0.0.1)."""
    servers[0].reset()
    return servers[0]


@pytest.fixture
def bait(servers: tuple[RecordingServer, RecordingServer]) -> Iterator[RecordingServer]:
    """A server that SSRF attempts aim at: it must never see a connection."""
    servers[1].reset()
    yield servers[1]
    assert servers[1].connections == 0, servers[1].requests


# ---------------------------------------------------------------- helpers


def load(policy: MediaFetchPolicy, source: str, **kwargs: object) -> bytes:
    async def main() -> bytes:
        fetcher = MediaFetcher(policy, **kwargs)  # type: ignore[arg-type]
        try:
            return await fetcher.load(source)
        finally:
            await fetcher.aclose()

    return asyncio.run(main())


def uniform(url: str) -> str:
    return f"could not fetch image from {url}"


def static_resolver(table: dict[str, list[str]], calls: list[str] | None = None) -> Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        name = host.removesuffix(".")  # an absolute name is the same name
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown test host")
        return table[name]

    return resolve


class FakeInternet(httpx.AsyncBaseTransport):
    """Answers ``routes`` (by IP) in-process, forwards loopback to a real transport (so a policy
    hole would reach the bait), and refuses (and records) anything else."""

    def __init__(self, routes: dict[str, Callable[[httpx.Request], httpx.Response]]) -> None:
        self.routes, self.real = routes, httpx.AsyncHTTPTransport()
        self.seen: list[httpx.Request] = []
        self.violations: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        host = request.url.host
        if host in self.routes:
            return self.routes[host](request)
        if host in LOOPBACK:
            return await self.real.handle_async_request(request)
        self.violations.append(host)
        raise httpx.ConnectError("FakeInternet refuses this address")

    async def aclose(self) -> None:
        await self.real.aclose()


# ---------------------------------------------------------------- 1. default policy refuses


def test_url_parser_and_resolver_forms() -> None:
    """What the URL parser yields for odd IPv4 spellings, and what getaddrinfo makes of them."""
    assert httpx.URL("http://2130706433:80/").host == "2130706433"  # a "name", not an IP...
    assert httpx.URL("http://0x7f000001/").host == "0x7f000001"
    with pytest.raises(httpx.InvalidURL):
        httpx.URL("http://0177.0.0.1/")
    for name in ("2130706433", "0x7f000001", "127.1"):  # ...which resolves to loopback
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
        assert {i[4][0] for i in infos} == {"127.0.0.1"}


REFUSED_BY_DEFAULT = [
    ("{bait}/png", "loopback"),
    ("http://localhost:{port}/png", "loopback"),
    ("http://[::1]:{port}/png", "loopback"),
    ("http://[::ffff:127.0.0.1]:{port}/png", "loopback"),
    ("http://0.0.0.0:{port}/png", "unspecified"),
    ("http://2130706433:{port}/png", "loopback"),
    ("http://0x7f000001:{port}/png", "loopback"),
    ("http://127.1:{port}/png", "loopback"),
    ("http://0177.0.0.1:{port}/png", "InvalidURL"),
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
    ("http://10.0.0.1/", "private"),
    ("http://192.168.1.1:{port}/", "private"),
    ("http://[fe80::1%25eth0]:{port}/", "link-local"),
    ("http://user:pw@127.0.0.1:{port}/png", "userinfo"),
    ("ftp://127.0.0.1:{port}/png", "scheme"),
    ("gopher://127.0.0.1:{port}/_GET%20/", "scheme"),
    ("file:///etc/passwd", "local files"),
    ("/etc/passwd", "local files"),
    ("http:///png", ""),
]


@pytest.mark.parametrize("template,reason", REFUSED_BY_DEFAULT)
def test_default_policy_refuses_without_contact(
    bait: RecordingServer, caplog: pytest.LogCaptureFixture, template: str, reason: str
) -> None:
    url = template.format(bait=bait.url, port=bait.server_port)
    caplog.set_level(logging.WARNING, logger=media_fetch_errors.logger.name)
    with pytest.raises(MediaFetchError) as info:
        load(MediaFetchPolicy(), url)
    assert str(info.value) == uniform(url)  # identical text whatever the cause
    assert not any(leak in str(info.value) for leak in ("Error", "<", " at 0x", "errno"))
    assert reason in caplog.text and url in caplog.text  # the real reason: server log only


# ---------------------------------------------------------------- 2. address classification

REFUSED_ADDRESSES = """
127.0.0.1 10.1.2.3 172.16.0.1 192.168.0.1 169.254.1.1 100.64.0.1 0.0.0.0 0.1.2.3 224.0.0.1
239.255.255.250 255.255.255.255 240.0.0.1 198.18.0.1 192.0.2.1 ::1 :: fe80::1 fe80::1%eth0 fc00::1
fd12::1 fec0::1 ff02::1 ff0e::1 ::ffff:127.0.0.1 ::ffff:10.0.0.1 ::ffff:169.254.169.254
2002:7f00:1:: 2002:a9fe:a9fe:: 2002:a00:1:: 64:ff9b::7f00:1 64:ff9b::a9fe:a9fe 64:ff9b::c0a8:1
2001:0:4136:e378:8000:63bf:3fff:fdd2
""".split()
ALLOWED_ADDRESSES = "8.8.8.8 93.184.215.14 2001:4860:4860::8888 ::ffff:8.8.8.8 2002:808:808::"
ALLOWED_ADDRESSES += " 64:ff9b::808:808"


# sorted: a frozenset's order varies with the process's hash seed, and xdist's workers must
# collect the same tests in the same order
@pytest.mark.parametrize("address", REFUSED_ADDRESSES + sorted(map(str, CLOUD_METADATA_ADDRESSES)))
def test_address_refused_by_default(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), MediaFetchPolicy()) is not None


@pytest.mark.parametrize("address", ALLOWED_ADDRESSES.split())
def test_public_address_allowed(address: str) -> None:  # classified only, never contacted
    assert address_refusal(ipaddress.ip_address(address), MediaFetchPolicy()) is None


def test_allowed_networks_open_exactly_those_but_never_metadata() -> None:
    policy = MediaFetchPolicy(
        allowed_networks=MediaFetchPolicy.parse_networks(
            "127.0.0.0/8, 10.0.0.0/8, 169.254.0.0/16, 100.64.0.0/10, 192.0.0.0/24, fd00::/8"
        )
    )
    for address in ("127.0.0.1", "::ffff:127.0.0.1", "10.9.8.7", "169.254.1.1", "fd00::5"):
        assert address_refusal(ipaddress.ip_address(address), policy) is None, address
    for address in ("192.168.0.1", "::1", "172.16.0.1"):
        assert address_refusal(ipaddress.ip_address(address), policy) is not None, address
    for metadata in [*CLOUD_METADATA_ADDRESSES, ipaddress.ip_address("::ffff:169.254.169.254")]:
        assert "metadata" in (address_refusal(metadata, policy) or ""), metadata
    assert "metadata" in (address_refusal(ipaddress.ip_address("2002:a9fe:a9fe::"), policy) or "")


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        MediaFetchPolicy(max_bytes=0)
    with pytest.raises(ValueError, match="total_timeout_s"):
        MediaFetchPolicy(total_timeout_s=float("inf"))
    with pytest.raises(ValueError, match="max_redirects"):
        MediaFetchPolicy(max_redirects=-1)
    with pytest.raises(ValueError, match="10.0.0.1/8"):
        MediaFetchPolicy.parse_networks(["10.0.0.1/8"])
    with pytest.raises(ValueError, match="allowed_domains"):
        MediaFetchPolicy(allowed_domains="cdn.test")  # type: ignore[arg-type]
    policy = MediaFetchPolicy(allowed_domains={"CDN.Test."}, allowed_networks=["fd00::/8"])  # type: ignore[arg-type]
    assert policy.allowed_domains == frozenset({"cdn.test"})
    assert policy.allowed_networks == (ipaddress.ip_network("fd00::/8"),)


# ---------------------------------------------------------------- 3. allowed destination


def test_fetch_from_allowed_network(origin: RecordingServer) -> None:
    assert load(MediaFetchPolicy(allowed_networks=LOCAL_NET), origin.url + "/png") == PNG
    assert origin.requests == [("/png", f"127.0.0.1:{origin.server_port}")]


def test_relative_redirect_within_limit(origin: RecordingServer) -> None:
    url = origin.url + "/redirect?to=/png&code=307"
    assert load(MediaFetchPolicy(allowed_networks=LOCAL_NET), url) == PNG
    assert [path for path, _ in origin.requests] == ["/redirect", "/png"]


def test_streamed_body_over_limit_stops_reading(origin: RecordingServer) -> None:
    url, total = origin.url + f"/stream?total={64 << 20}", 64 << 20
    with pytest.raises(ImageTooLargeError) as info:
        load(MediaFetchPolicy(allowed_networks=LOCAL_NET, max_bytes=100_000), url)
    assert str(info.value) == f"image at {url} exceeds 100000 bytes"
    assert origin.stream_done.wait(5)
    assert origin.stream["aborted"] and int(origin.stream["sent"]) < total


def test_content_length_over_limit_refused_without_reading(origin: RecordingServer) -> None:
    policy = MediaFetchPolicy(allowed_networks=LOCAL_NET, max_bytes=1000, total_timeout_s=5)
    start = time.monotonic()
    with pytest.raises(ImageTooLargeError):
        load(policy, origin.url + "/biglen")
    assert time.monotonic() - start < 2  # the body (never sent) was not waited for
    assert origin.client_gone.wait(2)


def test_drip_feed_hits_total_timeout(origin: RecordingServer) -> None:
    policy = MediaFetchPolicy(allowed_networks=LOCAL_NET, total_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(MediaFetchError) as info:
        load(policy, origin.url + "/drip")
    assert 0.4 < time.monotonic() - start < 2.5
    assert str(info.value) == uniform(origin.url + "/drip")


def test_read_timeout(origin: RecordingServer, caplog: pytest.LogCaptureFixture) -> None:
    policy = MediaFetchPolicy(allowed_networks=LOCAL_NET, read_timeout_s=0.3, total_timeout_s=5)
    start = time.monotonic()
    with pytest.raises(MediaFetchError) as info:
        load(policy, origin.url + "/stall")
    assert time.monotonic() - start < 2.5
    assert str(info.value) == uniform(origin.url + "/stall")
    assert "ReadTimeout" in caplog.text


def test_bad_status_same_message(origin: RecordingServer) -> None:
    with pytest.raises(MediaFetchError) as info:
        load(MediaFetchPolicy(allowed_networks=LOCAL_NET), origin.url + "/missing")
    assert str(info.value) == uniform(origin.url + "/missing")


def test_too_many_redirects(origin: RecordingServer) -> None:
    url = origin.url + "/loop/0"
    with pytest.raises(MediaFetchError) as info:
        load(MediaFetchPolicy(allowed_networks=LOCAL_NET, max_redirects=2), url)
    assert str(info.value) == uniform(url)
    assert [path for path, _ in origin.requests] == ["/loop/0", "/loop/1", "/loop/2"]


def test_long_url_is_truncated_in_message(bait: RecordingServer) -> None:
    url = bait.url + "/" + "a" * 300
    with pytest.raises(MediaFetchError) as info:
        load(MediaFetchPolicy(), url)
    assert str(info.value) == uniform(url[:117] + "...")


# ---------------------------------------------------------------- 4. redirects re-checked


def test_redirect_to_other_domain_refused(origin: RecordingServer, bait: RecordingServer) -> None:
    policy = MediaFetchPolicy(allowed_domains=frozenset({"cdn.test"}), allowed_networks=LOCAL_NET)
    resolver = static_resolver({"cdn.test": ["127.0.0.1"]})
    url = f"http://cdn.test:{origin.server_port}/redirect?to={bait.url}/x"
    with pytest.raises(MediaFetchError) as info:
        load(policy, url, resolver=resolver)
    assert str(info.value) == uniform(url)
    assert origin.requests == [("/redirect", f"cdn.test:{origin.server_port}")]
    ok = f"http://CDN.test.:{origin.server_port}/png"  # case and trailing dot normalized
    assert load(policy, ok, resolver=resolver) == PNG


@pytest.mark.parametrize(
    "target",
    [
        "{bait}/x",
        "http://localhost:{port}/x",
        "http://[::ffff:127.0.0.1]:{port}/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "file:///etc/passwd",
        "http://user@public.test/x",
    ],
)
def test_public_host_redirecting_inward_refused(bait: RecordingServer, target: str) -> None:
    location = target.format(bait=bait.url, port=bait.server_port)
    internet = FakeInternet(
        {PUBLIC_IP: lambda request: httpx.Response(302, headers={"Location": location})}
    )
    resolver = static_resolver({"public.test": [PUBLIC_IP], "localhost": ["127.0.0.1"]})
    with pytest.raises(MediaFetchError) as info:
        load(MediaFetchPolicy(), "http://public.test/img", resolver=resolver, transport=internet)
    assert str(info.value) == uniform("http://public.test/img")
    assert [r.url.host for r in internet.seen] == [PUBLIC_IP] and internet.violations == []


def test_https_connects_to_checked_ip_with_host_and_sni() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["Host"] == "public.test"
        assert request.extensions["sni_hostname"] == "public.test"
        return httpx.Response(200, content=PNG)

    internet = FakeInternet({PUBLIC_IP: answer})
    resolver = static_resolver({"public.test": [PUBLIC_IP]})
    url = "https://public.test/img.png"
    assert load(MediaFetchPolicy(), url, resolver=resolver, transport=internet) == PNG
    assert str(internet.seen[0].url) == f"https://{PUBLIC_IP}/img.png"


def test_unrequested_content_encoding_refused() -> None:
    internet = FakeInternet(
        {PUBLIC_IP: lambda r: httpx.Response(200, headers={"Content-Encoding": "gzip"})}
    )
    resolver = static_resolver({"public.test": [PUBLIC_IP]})
    with pytest.raises(MediaFetchError):
        load(MediaFetchPolicy(), "http://public.test/x", resolver=resolver, transport=internet)
    assert internet.seen[0].headers["Accept-Encoding"] == "identity"


# ---------------------------------------------------------------- 5./6. resolution


def test_resolves_once_and_connects_to_the_checked_address(origin: RecordingServer) -> None:
    calls: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["::1"]

    url = f"http://img.test:{origin.server_port}/png"  # the system resolver cannot resolve it
    assert load(MediaFetchPolicy(allowed_networks=LOCAL_NET), url, resolver=rebinding) == PNG
    assert calls == ["img.test"]
    assert origin.requests == [("/png", f"img.test:{origin.server_port}")]


def test_every_hop_resolved_once(origin: RecordingServer) -> None:
    calls: list[str] = []
    resolver = static_resolver({"img.test": ["127.0.0.1"]}, calls)
    url = f"http://img.test:{origin.server_port}/redirect?to=/png"
    assert load(MediaFetchPolicy(allowed_networks=LOCAL_NET), url, resolver=resolver) == PNG
    assert calls == ["img.test", "img.test"]


@pytest.mark.parametrize("answers", [["127.0.0.1", "10.0.0.1"], ["10.0.0.1", "127.0.0.1"]])
def test_any_refused_answer_refuses(origin: RecordingServer, answers: list[str]) -> None:
    url = f"http://img.test:{origin.server_port}/png"
    resolver = static_resolver({"img.test": answers})
    with pytest.raises(MediaFetchError) as info:
        load(MediaFetchPolicy(allowed_networks=LOCAL_NET), url, resolver=resolver)
    assert str(info.value) == uniform(url)
    assert origin.connections == 0


@pytest.mark.parametrize("answers", [[], ["not-an-ip"]])
def test_empty_or_bad_resolution_refused(answers: list[str]) -> None:
    with pytest.raises(MediaFetchError):
        load(
            MediaFetchPolicy(), "http://img.test/", resolver=static_resolver({"img.test": answers})
        )


# ---------------------------------------------------------------- 7. data URLs and local files


def test_data_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = MediaFetchPolicy(max_data_url_bytes=30)
    assert (
        load(policy, "data:image/png;base64," + base64.b64encode(b"x" * 30).decode()) == b"x" * 30
    )
    with pytest.raises(MediaFetchError, match="^invalid base64 in image data URL$"):
        load(policy, "data:image/png;base64,!!not base64!!")
    with pytest.raises(MediaFetchError, match="data:<mime>;base64"):
        load(policy, "data:image/png,rawbytes")
    too_big = "data:image/png;base64," + base64.b64encode(b"x" * 31).decode()
    with monkeypatch.context() as patch:  # refused on length alone: nothing is decoded
        patch.setattr(offline_media.base64, "b64decode", lambda *a, **k: pytest.fail("decoded"))
        with pytest.raises(ImageTooLargeError, match="exceeds 30 bytes"):
            load(policy, too_big)
    with pytest.raises(ImageTooLargeError):  # 32 bytes fit the 44-char bound of a 31-byte limit
        load(MediaFetchPolicy(max_data_url_bytes=31), too_big.replace("eA==", "eHg="))


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    (tmp_path / "media" / "sub").mkdir(parents=True)
    (tmp_path / "media" / "img.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)
    (tmp_path / "media" / "escape.png").symlink_to(tmp_path / "secret.png")
    (tmp_path / "media" / "inner.png").symlink_to(tmp_path / "media" / "img.png")
    os.mkfifo(tmp_path / "media" / "fifo.png")
    return tmp_path


def test_local_files_inside_allowed_dir(media_dir: Path) -> None:
    policy = MediaFetchPolicy(allowed_local_path=media_dir / "media")
    assert load(policy, str(media_dir / "media" / "img.png")) == PNG
    assert load(policy, (media_dir / "media" / "inner.png").as_uri()) == PNG
    with pytest.raises(ImageTooLargeError):
        load(
            MediaFetchPolicy(allowed_local_path=media_dir / "media", max_bytes=10),
            str(media_dir / "media" / "img.png"),
        )


def test_local_failures_look_identical(media_dir: Path) -> None:
    policy = MediaFetchPolicy(allowed_local_path=media_dir / "media")
    sources = [
        str(media_dir / "secret.png"),  # exists, outside
        str(media_dir / "media" / "missing.png"),
        str(media_dir / "media" / "escape.png"),  # symlink out of the dir
        str(media_dir / "media" / ".." / "secret.png"),
        str(media_dir / "media" / "sub"),  # a directory
        str(media_dir / "media" / "fifo.png"),  # not a regular file (and must not block)
        (media_dir / "secret.png").as_uri(),
        "file://otherhost" + str(media_dir / "media" / "img.png"),
    ]
    for source in sources:
        with pytest.raises(MediaFetchError) as info:
            load(policy, source)
        assert str(info.value) == f"could not read local image {source}", source


def test_local_files_any_or_none(media_dir: Path) -> None:
    assert load(MediaFetchPolicy(allowed_local_path=True), str(media_dir / "secret.png")) == PNG
    for allowed in (None, False):
        source = str(media_dir / "secret.png")
        with pytest.raises(MediaFetchError) as info:
            load(MediaFetchPolicy(allowed_local_path=allowed), source)
        assert str(info.value) == uniform(source)


# ---------------------------------------------------------------- 8. load_blocking


def test_load_blocking_from_sync_code(origin: RecordingServer) -> None:
    fetcher = MediaFetcher(MediaFetchPolicy(allowed_networks=LOCAL_NET))
    assert fetcher.load_blocking(origin.url + "/png") == PNG
    assert fetcher.load_blocking("data:image/png;base64," + base64.b64encode(PNG).decode()) == PNG
    with pytest.raises(MediaFetchError):
        fetcher.load_blocking("http://169.254.169.254/")
    asyncio.run(fetcher.aclose())


def test_load_blocking_inside_running_loop(origin: RecordingServer) -> None:
    async def main() -> None:
        fetcher = MediaFetcher(MediaFetchPolicy(allowed_networks=LOCAL_NET))
        assert await fetcher.load(origin.url + "/png") == PNG  # shared client on this loop
        assert fetcher.load_blocking(origin.url + "/png") == PNG  # helper thread, own client
        assert await fetcher.load(origin.url + "/png") == PNG
        await fetcher.aclose()

    asyncio.run(main())
    assert len(origin.requests) == 3


def test_fetcher_bound_to_one_loop(origin: RecordingServer) -> None:
    fetcher = MediaFetcher(MediaFetchPolicy(allowed_networks=LOCAL_NET))
    assert asyncio.run(fetcher.fetch(origin.url + "/png")) == PNG
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(fetcher.fetch(origin.url + "/png"))


# ---------------------------------------------------------------- 9. cancellation, slots


def test_cancel_releases_slot_and_connection(origin: RecordingServer) -> None:
    async def main() -> None:
        policy = MediaFetchPolicy(allowed_networks=LOCAL_NET, max_concurrent_fetches=1)
        fetcher = MediaFetcher(policy)
        task = asyncio.create_task(fetcher.fetch(origin.url + "/drip"))
        assert await asyncio.to_thread(origin.drip_started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.wait_for(fetcher.fetch(origin.url + "/png"), 2) == PNG
        await fetcher.aclose()

    asyncio.run(main())
    assert origin.client_gone.wait(2)  # the dripping server saw the connection go


def test_waiting_for_a_slot_counts_toward_the_deadline(origin: RecordingServer) -> None:
    async def main() -> float:
        policy = MediaFetchPolicy(
            allowed_networks=LOCAL_NET, max_concurrent_fetches=1, total_timeout_s=0.4
        )
        fetcher = MediaFetcher(policy)
        start = time.monotonic()
        async with fetcher._semaphore:  # every slot busy
            with pytest.raises(MediaFetchError):
                await fetcher.fetch(origin.url + "/png")
        waited = time.monotonic() - start
        await fetcher.aclose()
        return waited

    assert 0.3 < asyncio.run(main()) < 2.0
    assert origin.connections == 0


def test_a_connect_timeout_moves_on_to_the_next_checked_address() -> None:
    second_ip = "93.184.215.15"  # answered in-process only

    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("no answer", request=request)

    def image(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"png-bytes")

    transport = FakeInternet({PUBLIC_IP: timeout, second_ip: image})
    resolver = static_resolver({"two.test": [PUBLIC_IP, second_ip]})
    assert load(MediaFetchPolicy(), "http://two.test/x.png", resolver=resolver,
                transport=transport) == b"png-bytes"  # fmt: skip
    assert [r.url.host for r in transport.seen] == [PUBLIC_IP, second_ip]
