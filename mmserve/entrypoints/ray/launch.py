"""``mmserve serve --replicas N``: Ray (local or ``--ray-address``), Serve's HTTP proxy on
--host/--port, the application of ``app.build_app``; SIGINT / SIGTERM tear it down."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

import ray
from ray import serve

from mmserve.entrypoints.ray.app import build_app

logger = logging.getLogger(__name__)

APP_NAME = "mmserve"


def start_ray(args: argparse.Namespace) -> None:
    """Join ``--ray-address``, or start a local Ray sized for the replicas, on 127.0.0.1."""
    if args.ray_address:
        try:
            ray.init(address=args.ray_address, include_dashboard=False)
        except ConnectionError as exc:  # e.g. auto with no cluster running here
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ValueError(f"--ray-address {args.ray_address}: {first}") from None
        return
    wanted = (args.replicas or 1) * args.replica_cpus
    ray.init(
        num_cpus=max(os.cpu_count() or 1, int(wanted + 0.999)),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
    )


def deploy(args: argparse.Namespace) -> Any:
    """Start Serve's proxy on --host/--port and deploy (returns the ingress handle)."""
    serve.start(http_options={"host": args.host, "port": args.port})
    return serve.run(build_app(args), name=APP_NAME, route_prefix="/")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT / SIGTERM; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start_ray(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        deploy(args)
        count = "autoscaled" if args.ray_autoscaling else str(args.replicas)
        logger.info(
            "serving %s on http://%s:%d with %s engine replicas (%s routing)",
            args.model,
            args.host,
            args.port,
            count,
            args.routing,
        )
        stop.wait()
        logger.info("shutting down")
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
