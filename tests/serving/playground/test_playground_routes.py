"""The playground page's routes (``--ui``): served from the package, public even with an API
key (the API behind it is not), under a strict Content-Security-Policy; on by default only on
a loopback address."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from mmserve.cli import build_parser
from mmserve.entrypoints.openai.app import build_app
from mmserve.entrypoints.openai.http.policy import HTTPPolicy
from mmserve.entrypoints.openai.serve_policies import http_policy
from mmserve.entrypoints.openai.server import RunningServer

KEY = "page-key"


@pytest.fixture(scope="module")
def server(serve_model) -> Iterator[RunningServer]:
    with serve_model("tiny-llava", "--api-key", KEY, "--host", "127.0.0.1", "--ui") as srv:
        yield srv


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], True),
        (["--host", "localhost"], True),
        (["--host", "::1"], True),
        (["--host", "127.0.0.2"], True),
        (["--host", "::ffff:127.0.0.1"], True),
        (["--host", "::"], False),
        (["--host", "example.com"], False),
        (["--host", "0.0.0.0"], False),
        (["--host", "0.0.0.0", "--ui"], True),
        (["--no-ui"], False),
    ],
)
def test_page_is_on_by_default_only_on_loopback(flags: list[str], expected: bool) -> None:
    args = build_parser().parse_args(["serve", "--model", "tiny-llava", *flags])
    assert http_policy(args).ui is expected


def test_page_and_assets_are_public_with_a_strict_policy(server: RunningServer) -> None:
    page = httpx.get(f"{server.url}/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert '<script type="module" src="/ui/playground.js">' in page.text
    for name, media_type in [
        ("playground.js", "text/javascript"),
        ("api.js", "text/javascript"),
        ("playground.css", "text/css"),
    ]:
        asset = httpx.get(f"{server.url}/ui/{name}", timeout=10)
        assert asset.status_code == 200, name
        assert asset.headers["content-type"].startswith(media_type)
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 401
    # only the shipped files: no path escapes, and unknown names still need the key
    assert httpx.get(f"{server.url}/ui/..%2Fapp.py", timeout=10).status_code in (401, 404)
    auth = {"Authorization": f"Bearer {KEY}"}
    missing = httpx.get(f"{server.url}/ui/nope.js", headers=auth, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_every_module_the_page_imports_is_served(server: RunningServer) -> None:
    import re

    script = httpx.get(f"{server.url}/ui/playground.js", timeout=10).text
    for module in re.findall(r'from "\./([a-z_]+\.js)"', script):
        assert httpx.get(f"{server.url}/ui/{module}", timeout=10).status_code == 200, module


def test_without_ui_there_is_no_page(server: RunningServer) -> None:
    names = ["tiny-llava"]  # the shared server's metric label stays its own
    app = build_app(server.engine, served_model_names=names, policy=HTTPPolicy(ui=False))
    paths = {getattr(route, "path", None) for route in app.routes}
    assert "/" not in paths and "/ui/{name}" not in paths
    with_page = build_app(server.engine, served_model_names=names, policy=HTTPPolicy(ui=True))
    assert "/" in {getattr(route, "path", None) for route in with_page.routes}


def test_a_package_without_the_page_fails_loudly(tmp_path, monkeypatch) -> None:
    from mmserve.entrypoints.openai.routes import ui as ui_routes

    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "playground.js").write_text("")
    monkeypatch.setattr(ui_routes.resources, "files", lambda _package: tmp_path)
    with pytest.raises(RuntimeError, match="playground page is missing"):
        ui_routes.ui_files()
