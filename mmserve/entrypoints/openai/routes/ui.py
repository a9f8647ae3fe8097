"""The playground page (``--ui``): ``GET /`` and its scripts and stylesheet under ``/ui/``.

The files ship in the package (``ui/``: plain HTML, CSS and ES modules, no build step) and are
read once when the app is built. They are public even with an API key (they hold no data; the
page asks for the key and sends it on its API calls). A strict Content-Security-Policy allows
only this origin's scripts, styles and API, plus ``data:`` / ``blob:`` images and videos (the
user's own uploads), so nothing a model or a user writes can run as code.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from mmserve.entrypoints.openai.http.errors import APIError, error_response

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self' data: blob:; media-src data: blob:; base-uri 'none'; form-action 'none';"
        " frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def ui_files() -> dict[str, tuple[bytes, str]]:
    """``{file name: (bytes, media type)}`` of the shipped page."""
    files = {}
    for entry in resources.files("mmserve.entrypoints.openai").joinpath("ui").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _MEDIA_TYPES:
            files[entry.name] = (entry.read_bytes(), _MEDIA_TYPES[suffix])
    if "index.html" not in files:
        raise RuntimeError("the playground page is missing from the installed package (ui/)")
    return files


def ui_paths(files: dict[str, tuple[bytes, str]]) -> frozenset[str]:
    """The paths the page is served at (public: see the module docstring)."""
    return frozenset({"/"} | {f"/ui/{name}" for name in files if name != "index.html"})


def add_ui_routes(app: FastAPI, files: dict[str, tuple[bytes, str]]) -> None:
    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        body, media_type = files["index.html"]
        return Response(body, media_type=media_type, headers=SECURITY_HEADERS)

    @app.get("/ui/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in files or name == "index.html":
            return error_response(APIError(404, f"no such file: /ui/{name}", code="not_found"))
        body, media_type = files[name]
        return Response(body, media_type=media_type, headers=SECURITY_HEADERS)
