"""``mmserve serve``: flags (vLLM's names), their checks and their mapping to
``LLMEngine.from_args`` (the server's policies they make: ``serve_policies``).

Hooked into ``mmserve.cli.build_parser`` by ``add_serve_parser(sub, add_ray_flags)``, which
launches too. Imports of torch / FastAPI / uvicorn happen only when the subcommand runs, so
``mmserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from mmserve.arg_types import parse_bytes
from mmserve.engine.setup.chat_template_arg import load_chat_template_arg
from mmserve.engine.setup.generation_defaults import check_generation_config
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.openai.http.limits import add_limit_flags
from mmserve.entrypoints.openai.hub_model import engine_model, resolve_hub_model
from mmserve.entrypoints.openai.serve_policies import http_policy, media_policy
from mmserve.entrypoints.openai.vllm_flags import add_vllm_flags

DESCRIPTION = """\
Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
/v1/models, /tokenize, /detokenize) plus /health, /ping, /version and /metrics (Prometheus),
in one process. `mmserve serve MODEL` takes vLLM's flag names and value syntax; vLLM flags
mmserve cannot honour fail with one line naming the flag (see docs/vllm-compatibility.md).

Requests without max_tokens / max_completion_tokens generate at most
min(256, max_model_len - prompt tokens) tokens. Local image files are refused unless
--allowed-local-media-path is given (and then only files below that directory). Image URLs may
only point at public addresses (loopback, private, link-local and cloud-metadata addresses are
refused; --allowed-media-networks opts private networks in). SIGTERM drains: in-flight requests
get --shutdown-timeout seconds while new ones are answered 503.
"""


def add_serve_parser(
    sub: Any, add_scale_out_flags: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to an ``add_subparsers()`` object; ``add_scale_out_flags``
    adds the Ray Serve flags (``ray.flags``) after the vLLM ones. The caller sets ``func``."""
    p = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        action=_ModelAction,
        metavar="MODEL",
        help="preset name, HF checkpoint dir or hub model ID (ORG/NAME), as in `vllm serve MODEL`"
        f" (or --model; default: {EngineArgs.model})",
    )
    p.add_argument(
        "--model",
        default=EngineArgs.model,
        action=_ModelAction,
        help="the model, as a flag (default: %(default)s)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    p.add_argument(
        "--port", type=int, default=8000, help="port; 0 picks a free one (default: %(default)s)"
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) clients use in 'model' (default: --model)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("MMSERVE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 (default: $MMSERVE_API_KEY, else no key)",
    )
    p.add_argument(
        "--ui",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the playground page at / (default: on only when --host is a loopback"
        " address such as 127.0.0.1)",
    )
    p.add_argument(
        "--public-metrics",
        action="store_true",
        help="serve /metrics without the API key (default: /metrics needs it when one is set)",
    )
    p.add_argument(
        "--allowed-hosts",
        nargs="+",
        default=None,
        help="Host header values accepted, e.g. api.example.com '*.example.com' (default: any)",
    )
    p.add_argument(
        "--allowed-origins",
        nargs="+",
        default=None,
        help="browser origins allowed by CORS, e.g. https://app.example.com (default: none,"
        " no CORS headers)",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=256,
        help="answer 503 (with Retry-After) when this many requests already wait"
        " (default: %(default)s)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds in-flight requests get to finish (default: %(default)s)",
    )
    p.add_argument(
        "--skip-server-warmup",
        action="store_true",
        help="report healthy without first running a warm-up request through the engine and"
        " the media workers (SGLang's flag); the first request then pays first-call costs",
    )
    p.add_argument(
        "--text-workers",
        type=int,
        default=None,
        help="threads for chat templates, tokenization and large JSON bodies"
        " (default: min(4, cores))",
    )
    p.add_argument(
        "--media-workers",
        type=int,
        default=None,
        help="worker processes that decode, hash and preprocess images and decode videos"
        " (niced, off the server's GIL); 0 runs them in threads of the server process"
        " (default: half the cores, at least 1, at most 4)",
    )
    p.add_argument(
        "--enable-mm-embeds",
        action="store_true",
        help="accept image_embeds parts (base64 torch.save'd tensors; default: a 400)",
    )
    m = p.add_argument_group("media fetching (image and video URLs)")
    m.add_argument(
        "--allowed-local-media-path",
        default=None,
        help="directory image paths / file:// URLs may be read from (default: none,"
        " local files are refused)",
    )
    m.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=None,
        help="only fetch image URLs of these host names (exact match; default: any public host)",
    )
    m.add_argument(
        "--allowed-media-networks",
        nargs="+",
        default=None,
        metavar="CIDR",
        help="opt-in: also fetch from these non-public networks, e.g. 10.1.2.0/24 (cloud"
        " metadata addresses stay refused; default: public addresses only)",
    )
    m.add_argument(
        "--media-fetch-timeout",
        type=float,
        default=20.0,
        help="seconds one image fetch may take in all, redirects included (default: %(default)s)",
    )
    m.add_argument(
        "--max-concurrent-media-fetches",
        type=int,
        default=16,
        help="image downloads in flight at once (default: %(default)s)",
    )
    m.add_argument(
        "--max-video-bytes",
        type=parse_bytes,
        default=None,
        help="largest video accepted from any source (URL, data URL, file), e.g. 256MiB"
        " (default: 128 MiB; images: 20 MiB)",
    )
    add_limit_flags(p)
    engine = p.add_argument_group("engine (the same names as LLM(...) arguments)")
    EngineArgs.add_cli_args(engine, exclude=("model",))
    add_vllm_flags(p)
    if add_scale_out_flags is not None:
        add_scale_out_flags(p)
    p.add_argument(
        "--disable-uvicorn-access-log",
        action="store_true",
        help="no access-log lines at all (/health, /ping and /metrics never get one)",
    )
    p.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="uvicorn log level (default: %(default)s)",
    )
    return p


class _ModelAction(argparse.Action):
    """``MODEL`` and ``--model`` both set ``model``; given both, they must agree."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values is None:  # the positional, absent
            return
        mine, other = ("model_flag", "model_tag") if option_string else ("model_tag", "model_flag")
        given = getattr(namespace, other, None)
        if given is not None and given != values:
            parser.exit(
                2,
                f"{parser.prog}: error: the model is given twice and differently: MODEL"
                f" {getattr(namespace, 'model_tag', None) or values!r} and --model"
                f" {getattr(namespace, 'model_flag', None) or values!r}; give one\n",
            )
        setattr(namespace, mine, values)
        namespace.model = values


def check_server_flags(args: argparse.Namespace) -> None:
    """The server's own flags, checked before the model loads (ValueError naming the flag)."""
    bounds = {
        "text_workers": 1,
        "media_workers": 0,
        "shutdown_timeout": 0,
        "max_queued_requests": 0,
    }
    for name, low in bounds.items():
        value = getattr(args, name)
        if value is not None and value < low:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    if not 0 <= args.port <= 65535:  # else the socket calls wrap it (70000 -> 4464)
        raise ValueError(f"--port must be 0-65535, got {args.port}")


def engine_args(args: argparse.Namespace) -> EngineArgs:
    """The engine settings among the parsed ``serve`` flags (``model``: a hub ID's downloaded
    snapshot once ``validate_serve_flags`` resolved it)."""
    settings = EngineArgs.from_cli_args(args)
    model = engine_model(args)
    return settings if model == settings.model else settings.replace(model=model)


def validate_serve_flags(args: argparse.Namespace) -> EngineArgs:
    """Every check the server, the engine and its store make on the ``serve`` flags, run
    through their own code in this process before anything loads or is deployed, without
    torch: ValueError naming the flag, ``MissingExtra`` naming the extra to install
    (``mmserve`` prints either as one line, exit code 2). The Ray flags are checked by
    ``ray.flags.check_ray_flags`` beside it. Last, a hub model ID is downloaded
    (``hub_model.resolve_hub_model``; its failures are ValueErrors too). Returns the engine
    settings, whose ``model`` is then the local snapshot."""
    settings = engine_args(args)  # values, the frozen configs' checks included
    check_server_flags(args)
    http_policy(args)
    media_policy(args)
    settings.validate()  # the encoder store's: secret, redis client, directory
    if settings.chat_template is not None:
        load_chat_template_arg(settings.chat_template)
    check_generation_config(settings.generation_config)
    resolve_hub_model(args)
    return engine_args(args)
