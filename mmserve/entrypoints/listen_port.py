"""The port ``mmserve serve`` listens on, checked before a model loads or Ray starts."""

from __future__ import annotations

import errno
import socket

# A local Ray's dashboard agent always listens here (ray._private.ray_constants'
# DEFAULT_DASHBOARD_AGENT_LISTEN_PORT; ray.init has no setting for it), and it binds before
# Serve's HTTP proxy does.
RAY_AGENT_PORT = 52365


def check_listen_port(host: str, port: int, local_ray: bool) -> None:
    """ValueError naming ``--port`` (or ``--host``) when the server could not listen there: the
    port is in use, or (``local_ray``: ``--replicas`` without ``--ray-address``) it is the one
    the local Ray's own agent takes. Port 0 (any free one) always passes."""
    if port == 0:
        return
    if local_ray and port == RAY_AGENT_PORT:
        raise ValueError(
            f"--port {port} is where the local Ray's dashboard agent listens; choose another"
            " port, or join a running Ray with --ray-address"
        )
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r} does not resolve ({exc.strerror})") from None
    problem = ""
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                problem = f"--port {port} on {host} is in use by another process"
            else:
                problem = f"--host {host} --port {port}: cannot listen ({exc.strerror})"
    if problem:
        raise ValueError(problem)


def free_port() -> int:
    """A loopback port free now, never the one a local Ray's agent takes when it starts (a
    CI run drew it, and the Ray test's own cluster took it from Serve's proxy)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != RAY_AGENT_PORT:
            return port
