"""The Ray Serve application: an OpenAI ingress deployment in front of engine replicas.

``build_app(args)`` takes parsed ``mmserve serve`` flags; ``app_builder(config)`` takes the
same settings as a dict (``serve run`` / ``serve deploy`` config files, see docs/ray.md).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from mmserve.engine.admission.pipeline import AdmissionExecutors
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.openai.app import build_app as build_openai_app
from mmserve.entrypoints.openai.cli_args import (
    add_serve_parser,
    check_server_flags,
    engine_args,
    validate_serve_flags,
)
from mmserve.entrypoints.openai.serve_policies import http_policy, media_policy
from mmserve.entrypoints.ray.flags import add_ray_flags, check_ray_flags
from mmserve.entrypoints.ray.frontend import FrontendEngine, ReplicaFacts
from mmserve.entrypoints.ray.replica import EngineReplica
from mmserve.entrypoints.ray.routed_engine import RoutedEngine
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.workers import MediaWorkers

ROUTER_CLASS = "mmserve.entrypoints.ray.router.ImageAffinityRouter"
HEALTH_CHECK_PERIOD_S = 5.0
INGRESS_MAX_ONGOING = 4096


@serve.ingress()
class OpenAIIngress:
    """mmserve's own OpenAI app (same routes, errors, streaming) around a ``RoutedEngine``,
    plus ``GET /cluster``: per-replica and total engine counters and the routing decisions.
    ``/metrics`` refreshes the replicas' sum (bounded) and exports the routing counts."""

    def __init__(self, replicas: DeploymentHandle, args: argparse.Namespace) -> None:
        check_server_flags(args)
        self.replicas = replicas
        self.args = args

    async def __serve_build_asgi_app__(self) -> FastAPI:
        args = self.args
        settings = engine_args(args)
        facts = ReplicaFacts(**await self.replicas.describe.remote())
        fetch_policy = media_policy(args)
        frontend = FrontendEngine(settings, facts, fetch_policy)
        executors = AdmissionExecutors.sized_for(args.text_workers)
        processes = executors.media_workers if args.media_workers is None else args.media_workers
        engine = RoutedEngine(
            frontend,
            self.replicas,
            executors=executors,
            fetcher=MediaFetcher(fetch_policy),
            media_workers=MediaWorkers(frontend.processor, processes) if processes else None,
        )
        policy = http_policy(args)
        app = build_openai_app(
            engine,
            served_model_names=list(args.served_model_name or [args.model]),
            model_aliases={args.model, str(frontend.config.model.path)},
            policy=policy,
            model_root=args.model,
            metrics_refresh=engine.refresh_metrics,
            warm_up=not args.skip_server_warmup,
        )

        @app.get("/cluster")
        async def cluster() -> dict[str, Any]:
            return await engine.cluster_stats()

        return app


def replica_options(args: argparse.Namespace, settings: EngineArgs) -> dict[str, Any]:
    """Ray Serve options of the engine deployment from the flags."""
    options: dict[str, Any] = {
        "name": "EngineReplica",
        "ray_actor_options": {"num_cpus": args.replica_cpus},
        # Ray only queues beyond this; the engine's own bound answers 503 first
        "max_ongoing_requests": settings.max_num_seqs + (args.max_queued_requests or 0) + 1,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "request_router_config": {
            "request_router_class": ROUTER_CLASS,
            "request_router_kwargs": {
                "load_factor": args.routing_load_factor,
                "policy": args.routing,
            },
        },
    }
    if args.ray_autoscaling:
        options["autoscaling_config"] = dict(args.ray_autoscaling)
        options["num_replicas"] = "auto"
    else:
        options["num_replicas"] = args.replicas or 1
    return options


def build_app(args: argparse.Namespace) -> Application:
    """The application of parsed ``mmserve serve`` flags (``--replicas`` and friends), checked
    here as the CLI checks them (a config file too), before a replica or the ingress starts."""
    settings = validate_serve_flags(args)
    check_ray_flags(args)
    replica = serve.deployment(**replica_options(args, settings))(EngineReplica)
    threads = max(1, int(args.replica_cpus))
    replicas = replica.bind(
        dataclasses.asdict(settings),
        args.max_queued_requests,
        threads,
        warm_up=not args.skip_server_warmup,
    )
    ingress = serve.deployment(
        name="OpenAIIngress",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
    )(OpenAIIngress)
    return ingress.bind(replicas, args)


def namespace_from_config(config: dict[str, Any]) -> argparse.Namespace:
    """``serve`` flags from a dict of their names (``max_num_seqs: 8``, ``replicas: 2``),
    parsed by the CLI's own parser, so a config file is checked exactly like the command."""
    parser = argparse.ArgumentParser(prog="mmserve")
    commands = parser.add_subparsers(dest="command")
    add_serve_parser(commands, add_ray_flags)
    negatable = {
        option
        for action in commands.choices["serve"]._actions
        if isinstance(action, argparse.BooleanOptionalAction)
        for option in action.option_strings
    }
    argv: list[str] = []
    for name, value in config.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False and "--no-" + flag[2:] in negatable:
            argv.append("--no-" + flag[2:])
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        elif isinstance(value, dict):
            import json

            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return parser.parse_args(["serve", *argv])


def app_builder(config: dict[str, Any]) -> Application:
    """``serve run mmserve.entrypoints.ray.app:app_builder model=tiny-llava replicas=2``, or a
    config file's ``import_path`` with ``args``. The playground page is off unless the config
    says ``ui: true``: Serve's ``http_options`` decide where the proxy listens, not ``host``."""
    return build_app(namespace_from_config({"ui": False, **config}))
