"""``mmserve serve`` flags of the Ray Serve scale-out (no Ray import: ``--help`` stays fast)."""

from __future__ import annotations

import argparse
import json
import socket
from typing import Any

from mmserve.entrypoints.ray.rendezvous import DEFAULT_LOAD_FACTOR

RAY_CONNECT_S = 5.0  # how long --ray-address's host:port may take to accept a connection


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "scale-out on Ray Serve (needs the `mmserve[ray]` extra; see docs/ray.md)"
    )
    g.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="run N engine replicas as Ray Serve deployments behind one OpenAI ingress on"
        " --host/--port (default: one process, no Ray)",
    )
    g.add_argument(
        "--routing",
        choices=("affinity", "pow2"),
        default="affinity",
        help="replica choice: image-affinity rendezvous hashing with a load bound, or Ray's"
        " power of two choices (default: %(default)s)",
    )
    g.add_argument(
        "--routing-load-factor",
        type=float,
        default=DEFAULT_LOAD_FACTOR,
        help="affinity spills to the next replica when the chosen one would hold more than"
        " this times the mean in-flight requests (default: %(default)s)",
    )
    g.add_argument(
        "--replica-cpus",
        type=float,
        default=1.0,
        help="Ray CPUs per engine replica; its torch threads (default: %(default)s)",
    )
    g.add_argument(
        "--ray-autoscaling",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="Ray Serve autoscaling_config for the engine replicas, e.g."
        ' \'{"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}\''
        " (replaces the fixed --replicas count)",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        help="an existing Ray cluster (e.g. ray://head:10001 or auto; default: start a local"
        " one bound to 127.0.0.1)",
    )


def check_ray_flags(args: argparse.Namespace) -> None:
    """ValueError naming the flag (``--ray-address``: ``check_ray_address``)."""
    if args.replicas is not None and args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if args.routing_load_factor < 1.0:
        raise ValueError(f"--routing-load-factor must be >= 1, got {args.routing_load_factor}")
    if args.replica_cpus <= 0:
        raise ValueError(f"--replica-cpus must be > 0, got {args.replica_cpus}")
    if getattr(args, "ray_address", None):
        check_ray_address(args.ray_address)


def check_ray_address(address: str) -> None:
    """ValueError naming ``--ray-address`` when it is ``host:port`` (or ``ray://host:port``)
    and nothing there takes a connection within ``RAY_CONNECT_S``: ``ray.init`` retries such
    an address for minutes. Other forms (``auto``) are left to Ray, whose refusal
    ``launch.start_ray`` turns into the same kind of error."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), RAY_CONNECT_S).close()
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ValueError(
            f"--ray-address {address}: no Ray cluster answers there ({why}); start one with"
            " `ray start --head`, or leave the flag out for a local one"
        ) from None


def wants_ray(args: argparse.Namespace) -> bool:
    return getattr(args, "replicas", None) is not None or bool(
        getattr(args, "ray_autoscaling", None)
    )
