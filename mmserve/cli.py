"""``mmserve`` command line: generate, tiny-model, serve, bench.

Building the parser imports neither torch nor transformers (``mmserve --help`` stays fast):
each subcommand imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from mmserve.bench.cli import add_bench_parser
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.listen_port import check_listen_port
from mmserve.entrypoints.openai.cli_args import add_serve_parser, validate_serve_flags
from mmserve.entrypoints.ray.flags import add_ray_flags, check_ray_flags, wants_ray
from mmserve.extras import MissingExtra, require_extra
from mmserve.version import package_version


def _generate(args: argparse.Namespace) -> int:
    settings = EngineArgs.from_cli_args(args)
    settings.validate()  # the store's checks too, before torch is imported
    from mmserve import LLM, SamplingParams

    llm = LLM(**dataclasses.asdict(settings))
    content: list[dict] = [{"type": "image_url", "image_url": {"url": p}} for p in args.image]
    content.append({"type": "text", "text": args.prompt})
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    out = llm.chat([{"role": "user", "content": content}], params, use_tqdm=False)[0]
    print(out.outputs[0].text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Every flag checked before a model loads or Ray starts, then serve until SIGINT /
    SIGTERM: one server, or engine replicas on Ray Serve (``--replicas`` and friends)."""
    validate_serve_flags(args)
    check_ray_flags(args)
    if wants_ray(args):
        if not args.ray_address:  # else Serve's proxy listens on that cluster's nodes
            check_listen_port(args.host, args.port, local_ray=True)
        require_extra("ray.serve", "ray", "--replicas / --ray-autoscaling (Ray Serve)")
        from mmserve.entrypoints.ray.launch import run as run_replicas

        return int(run_replicas(args))
    check_listen_port(args.host, args.port, local_ray=False)
    from mmserve.entrypoints.openai.server import run

    return int(run(args))


def _tiny_model(args: argparse.Namespace) -> int:
    from mmserve.models.tiny import PRESET_NAMES, build_preset

    if args.name not in PRESET_NAMES:
        raise ValueError(f"unknown preset {args.name!r}; choose from {', '.join(PRESET_NAMES)}")
    path = build_preset(args.name, args.out)
    print(f"wrote {args.name} to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmserve", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"mmserve {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete one prompt (with images) and print it")
    gen.add_argument("--image", action="append", default=[], help="image path or URL (repeat)")
    gen.add_argument("--prompt", default="What is in this image?")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    EngineArgs.add_cli_args(gen.add_argument_group("engine (the same names as LLM(...) arguments)"))
    gen.set_defaults(func=_generate)

    tiny = sub.add_parser("tiny-model", help="write a built-in random-weight checkpoint")
    tiny.add_argument(
        "name", metavar="PRESET", help="tiny-llava, tiny-llava-small, tiny-qwen2-vl, ..."
    )
    tiny.add_argument("--out", required=True, help="output directory")
    tiny.set_defaults(func=_tiny_model)
    add_serve_parser(sub, add_ray_flags).set_defaults(func=_serve)
    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, MissingExtra) as exc:  # a bad setting, a missing optional dependency
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
