"""A fake Hugging Face Hub on 127.0.0.1: just the endpoints ``huggingface_hub.snapshot_download``
(2.x) calls, serving in-memory repositories, recording every request.

- ``GET /api/models/{repo}/revision/{rev}``: model info (``sha``, ``siblings``).
- ``GET /api/models/{repo}/tree/{rev}``: the file listing (one page).
- ``HEAD`` / ``GET /{repo}/resolve/{rev}/{file}``: a file, with the headers huggingface_hub
  checks (``X-Repo-Commit``, ``ETag``, ``Content-Length``).
- A repository that does not exist: 404 with ``X-Error-Code: RepoNotFound``; a gated one: 401
  with ``GatedRepo``; an unknown revision: 404 ``RevisionNotFound``; an unknown file: 404
  ``EntryNotFound``.

``rev`` is a branch / tag name or a commit sha. Commits are the sha1 of their files' hashes, so
two revisions with the same files share one. The server runs only inside ``with FakeHub()``
(the tests' fixtures). ``use_hub`` points this process's ``huggingface_hub`` at an endpoint,
``hub_env`` a subprocess's.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from mmserve.entrypoints.listen_port import free_port


@dataclass
class FakeRepo:
    """``refs``: revision name -> commit sha; ``commits``: sha -> {file path: bytes}."""

    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: bool = False

    def files(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        sha = self.refs.get(revision, revision)
        return (sha, self.commits[sha]) if sha in self.commits else None


class FakeHub:
    """Start with ``with FakeHub() as hub:``; ``hub.url`` is the ``HF_ENDPOINT``;
    ``hub.requests`` lists ``(method, path)`` of every request served."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(
        self, repo_id: str, files: dict[str, bytes], revision: str = "main", gated: bool = False
    ) -> str:
        """Publish ``files`` as ``revision`` of ``repo_id``; returns the commit sha."""
        repo = self.repos.setdefault(repo_id, FakeRepo(gated=gated))
        digest = hashlib.sha1()
        for name in sorted(files):
            digest.update(name.encode() + hashlib.sha256(files[name]).digest())
        sha = digest.hexdigest()
        repo.commits[sha] = dict(files)
        repo.refs[revision] = sha
        return sha

    def files_requested(self, method: str | None = None) -> set[str]:
        """The file names asked of ``resolve`` (by ``method``: HEAD, GET; default: either)."""
        names = set()
        for verb, path in self.requests:
            if "/resolve/" in path and method in (None, verb):
                names.add(path.split("/resolve/", 1)[1].split("/", 1)[1])
        return names

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def use_hub(
    monkeypatch: Any, endpoint: str, home: Path, offline: bool = False, cache: Path | None = None
) -> Path:
    """Point this process's ``huggingface_hub`` at ``endpoint`` with its home (token, cache) in
    ``home``, as ``HF_ENDPOINT`` / ``HF_HOME`` / ``HF_HUB_OFFLINE`` would at import time (it
    reads them into ``constants`` then), no token, and mmserve's per-process memo empty.
    Returns the hub cache directory (``cache``, default ``home/hub``)."""
    from huggingface_hub import constants

    from mmserve.models.checkpoint import hub

    cache = cache or home / "hub"
    patches = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": offline,
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
    }
    for name, value in patches.items():
        monkeypatch.setattr(constants, name, value)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub, "_resolved", {})
    return cache


def hub_env(endpoint: str, home: Path, offline: bool = False) -> dict[str, str]:
    """The environment of a subprocess using ``endpoint`` with its home in ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_PROGRESS_BARS="1")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def dead_endpoint() -> str:
    """A 127.0.0.1 URL nothing listens on (connections are refused)."""
    return f"http://127.0.0.1:{free_port()}"


def checkpoint_files(directory: Path) -> dict[str, bytes]:
    """Every file of a checkpoint directory (one level), by name."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            api = path.startswith("/api/models/")
            parts = path.removeprefix("/api/models/").lstrip("/").split("/")
            if len(parts) < 4 or parts[2] not in (("revision", "tree") if api else ("resolve",)):
                return self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"})
            repo_id, kind, revision = "/".join(parts[:2]), parts[2], parts[3]
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            if repo.gated and "authorization" not in {k.lower() for k in self.headers}:
                return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted")
            found = repo.files(revision)
            if found is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            sha, files = found
            if kind == "revision":
                info = {"id": repo_id, "sha": sha, "siblings": [{"rfilename": f} for f in files]}
                return self._send(200, json.dumps(info).encode(), {}, body)
            if kind == "tree":
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
                    for name, data in files.items()
                ]
                return self._send(200, json.dumps(tree).encode(), {}, body)
            name = "/".join(parts[4:])
            if name not in files:
                return self._error(404, "EntryNotFound", f"{name} does not exist", sha)
            data = files[name]
            headers = {"X-Repo-Commit": sha, "ETag": f'"{_oid(data)}"'}
            return self._send(200, data, headers, body, "application/octet-stream")

        def _error(self, status: int, code: str, message: str, sha: str | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            if sha is not None:
                headers["X-Repo-Commit"] = sha
            self._send(status, json.dumps({"error": message}).encode(), headers)

        def _send(
            self,
            status: int,
            data: bytes,
            headers: dict[str, str],
            body: bool = True,
            content_type: str = "application/json",
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(data)

    return Handler


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()
