"""The ``serve`` flags as the policies the server enforces: ``http_policy`` (who may call, what
one request may ask, whether the playground page is served) and ``media_policy`` (which image
and video sources may be fetched or read). ``cli_args.validate_serve_flags`` builds both before
anything loads, so a bad value fails there; ``server`` and the Ray application use them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mmserve.entrypoints.openai.http.limits import limits_from_args
from mmserve.entrypoints.openai.http.policy import HTTPPolicy, ui_default


def http_policy(args: argparse.Namespace) -> HTTPPolicy:
    """Who may call the server, what one request may ask, and whether the page is served."""
    return HTTPPolicy(
        api_key=args.api_key,
        public_metrics=args.public_metrics,
        allowed_hosts=tuple(args.allowed_hosts or ()),
        allowed_origins=tuple(args.allowed_origins or ()),
        limits=limits_from_args(args),
        ui=ui_default(args.host) if args.ui is None else args.ui,
        mm_embeds=args.enable_mm_embeds,
    )


def media_policy(args: argparse.Namespace) -> Any:
    """The ``MediaFetchPolicy`` of the media flags (ValueError naming a bad value)."""
    from mmserve.multimodal.media.policy import MediaFetchPolicy

    media = args.allowed_local_media_path
    local = Path(media).expanduser().resolve() if media else None
    if local is not None and not local.is_dir():
        raise ValueError(f"--allowed-local-media-path {media!r} is not a directory")
    domains = args.allowed_media_domains
    return MediaFetchPolicy(
        allowed_domains=frozenset(d.lower().rstrip(".") for d in domains) if domains else None,
        allowed_networks=MediaFetchPolicy.parse_networks(args.allowed_media_networks or ()),
        allowed_local_path=local,
        total_timeout_s=args.media_fetch_timeout,
        max_concurrent_fetches=args.max_concurrent_media_fetches,
        **({} if args.max_video_bytes is None else {"max_video_bytes": args.max_video_bytes}),
    )
