"""``mmserve serve``: flags (vLLM's names), their mapping to ``LLMEngine.from_args``, launching.

Hooked into ``mmserve.entrypoints.cli.build_parser`` by ``add_serve_parser(sub)``. Imports of
torch / FastAPI / uvicorn happen only when the subcommand runs, so ``mmserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
/v1/models) plus /health and /metrics (Prometheus), in one process.

Requests without max_tokens / max_completion_tokens generate at most
min(256, max_model_len - prompt tokens) tokens. Local image files are refused unless
--allowed-local-media-path is given (and then only files below that directory).
"""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``1073741824``, ``512MiB``, ``1G``, ``1.5GB`` -> bytes (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 512MiB, 1GiB)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** " kmgt".index(unit.lower() or " "))


def parse_mm_limits(text: str) -> dict[str, int]:
    """``'{"image": 2}'`` -> {"image": 2}; anything else is a usage error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    ok = isinstance(value, dict) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values()
    )
    if not ok:
        raise argparse.ArgumentTypeError(
            f'expected a JSON object of non-negative counts like {{"image": 2}}, got {text!r}'
        )
    return value


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to an ``add_subparsers()`` object."""
    p = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="tiny-llava",
        help="preset name or HF checkpoint dir (default: %(default)s)",
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
        "--allowed-local-media-path",
        default=None,
        help="directory image paths / file:// URLs may be read from (default: none,"
        " local files are refused)",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="answer 503 when this many requests already wait (default: no limit)",
    )
    e = p.add_argument_group("engine")
    e.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float16", "bfloat16"),
        help="weight / activation dtype (default: %(default)s)",
    )
    e.add_argument("--seed", type=int, default=0, help="engine seed (default: %(default)s)")
    e.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context length (default: from the model config)",
    )
    e.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="token budget per step (default: %(default)s)",
    )
    e.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="max requests in the running batch (default: %(default)s)",
    )
    e.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="tokens per KV cache block (default: %(default)s)",
    )
    e.add_argument(
        "--num-kv-blocks",
        type=int,
        default=None,
        help="KV cache blocks (default: max-num-seqs full-length sequences, capped"
        " by --kv-cache-memory)",
    )
    e.add_argument(
        "--kv-cache-memory",
        type=parse_bytes,
        default="1GiB",
        help="KV cache memory cap, e.g. 512MiB (default: 1GiB)",
    )
    e.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse KV blocks of shared prefixes, images included (default: on)",
    )
    e.add_argument(
        "--limit-mm-per-prompt",
        type=parse_mm_limits,
        default=None,
        help="max items per prompt as JSON, e.g. '{\"image\": 2}' (default: 16 images)",
    )
    e.add_argument(
        "--disable-chunked-mm-input",
        action="store_true",
        help="never split an image's tokens across prefill chunks",
    )
    e.add_argument(
        "--encoder-cache-size",
        type=int,
        default=None,
        help="encoder cache capacity in embeddings (default: autotuned)",
    )
    e.add_argument(
        "--encoder-cache-memory",
        type=parse_bytes,
        default="1GiB",
        help="encoder cache memory when --encoder-cache-size is unset, e.g. 512MiB (default: 1GiB)",
    )
    e.add_argument(
        "--max-num-encoder-input-tokens",
        type=int,
        default=None,
        help="encoder compute budget per step in embeddings (default: autotuned)",
    )
    p.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="uvicorn log level (default: %(default)s)",
    )
    p.set_defaults(func=run_server)
    return p


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of ``LLMEngine.from_args`` (the model excluded) from parsed flags."""
    media = args.allowed_local_media_path
    return {
        "dtype": args.dtype,
        "seed": args.seed,
        "max_model_len": args.max_model_len,
        "block_size": args.block_size,
        "num_kv_blocks": args.num_kv_blocks,
        "kv_cache_memory": args.kv_cache_memory,
        "enable_prefix_caching": args.enable_prefix_caching,
        "encoder_cache_memory": args.encoder_cache_memory,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "disable_chunked_mm_input": args.disable_chunked_mm_input,
        "encoder_cache_size": args.encoder_cache_size,
        "max_num_encoder_input_tokens": args.max_num_encoder_input_tokens,
        "limit_mm_per_prompt": args.limit_mm_per_prompt,
        "allowed_local_path": Path(media).expanduser().resolve() if media else None,
    }


def run_server(args: argparse.Namespace) -> int:
    """Build the engine and serve until SIGINT / SIGTERM (the ``serve`` subcommand)."""
    from mmserve.entrypoints.openai.server import run

    return run(args)
