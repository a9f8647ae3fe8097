"""``mmserve serve ORG/NAME``: a hub model ID is downloaded once, by the process that parses the
flags, before the engine loads or Ray deploys (torch-free)."""

from __future__ import annotations

import argparse

from mmserve.models.checkpoint.hub import download_checkpoint, is_hub_id


def resolve_hub_model(args: argparse.Namespace) -> None:
    """If ``args.model`` is a hub ID (preset names have no ``/``; an existing local directory
    wins), download it now (``--revision``, ``--download-dir``) and record the snapshot
    directory in ``args.model_path``. ``cli_args.engine_args`` hands that path to the engine,
    and Ray replicas and the ingress get it with the flags, so no other process downloads;
    ``args.model`` stays the ID (the default served model name, ``/v1/models``' root).
    Idempotent. ValueError of one line naming the model on failure."""
    if getattr(args, "model_path", None) is not None or not is_hub_id(args.model):
        return
    path = download_checkpoint(args.model, args.revision, args.download_dir)
    args.model_path = str(path)


def engine_model(args: argparse.Namespace) -> str:
    """The engine's ``model``: the downloaded snapshot of a hub ID, else ``--model`` as given."""
    return getattr(args, "model_path", None) or args.model
