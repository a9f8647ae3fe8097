"""Hub model IDs (``ORG/NAME``): downloaded with ``huggingface_hub`` into its cache.

- Only the files mmserve reads are fetched (``HUB_FILE_PATTERNS``): configs, safetensors
  weights and their index, tokenizer, processor and chat-template files; never ``*.bin``,
  ``*.pt``, ``*.gguf``, ONNX or other formats' weights.
- ``huggingface_hub`` reads its own environment: ``HF_ENDPOINT``, ``HF_TOKEN`` (never read nor
  logged here), ``HF_HOME`` / ``HF_HUB_CACHE``, and ``HF_HUB_OFFLINE`` (then only the cache is
  used: a branch or tag resolves through the cache's refs, and nothing is requested).
- A snapshot is resolved once per process per (ID, revision, cache, endpoint): later calls
  return the same directory without asking the hub again, so one process serves one commit.
- Every failure (missing, private or gated repository, unknown revision, unreachable endpoint,
  offline with nothing cached, not a safetensors checkpoint) is a ``ValueError`` of one line
  naming the model.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

logger = logging.getLogger("mmserve.models.hub")  # its log name before the move

HUB_FILE_PATTERNS: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "added_tokens.json",
    "special_tokens_map.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "chat_template.jinja",
)

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_resolved: dict[tuple[str, str | None, str, str], Path] = {}


def is_hub_id(name: str) -> bool:
    """``ORG/NAME`` in the hub's spelling (one slash, no ``..``) that is not an existing local
    path: a local directory of that name wins over the hub."""
    return (
        _HUB_ID.fullmatch(name) is not None
        and ".." not in name
        and not Path(name).expanduser().exists()
    )


def download_checkpoint(
    repo_id: str, revision: str | None = None, download_dir: str | Path | None = None
) -> Path:
    """The local snapshot directory of ``repo_id`` at ``revision`` (default: the repository's
    default branch), downloaded into ``download_dir`` (default: huggingface_hub's cache) when
    missing. It holds ``config.json`` and at least one ``*.safetensors`` file.

    Raises ValueError (one line naming the model) for any failure."""
    from huggingface_hub import constants

    cache = str(Path(download_dir or constants.HF_HUB_CACHE).expanduser().resolve())
    key = (repo_id, revision, cache, constants.ENDPOINT)
    if key in _resolved:
        return _resolved[key]
    where = f"{constants.ENDPOINT}" + (" (offline: cache only)" if constants.HF_HUB_OFFLINE else "")
    logger.info("model %s: resolving revision %s from %s into %s", repo_id, revision, where, cache)
    path = _snapshot(repo_id, revision, cache)
    if not (path / "config.json").is_file():
        raise ValueError(f"model {repo_id!r}: the repository has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ValueError(
            f"model {repo_id!r}: the repository has no *.safetensors weights (mmserve loads"
            " safetensors only)"
        )
    _resolved[key] = path
    return path


def _snapshot(repo_id: str, revision: str | None, cache: str) -> Path:
    """``snapshot_download`` with its exceptions turned into one-line ValueErrors."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    model = f"model {repo_id!r}"
    rev = f"revision {revision or constants.DEFAULT_REVISION!r}"
    endpoint = constants.ENDPOINT
    try:
        return Path(
            snapshot_download(
                repo_id, revision=revision, cache_dir=cache, allow_patterns=list(HUB_FILE_PATTERNS)
            )
        )
    except RevisionNotFoundError:
        raise ValueError(f"{model}: {rev} not found on {endpoint}") from None
    except GatedRepoError:
        raise ValueError(
            f"{model} is gated on {endpoint}: accept its conditions on the model page, then set"
            " HF_TOKEN to a token of an account with access"
        ) from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"{model}: no such repository on {endpoint} (a private one needs HF_TOKEN set to a"
            " token with access)"
        ) from None
    except LocalEntryNotFoundError as exc:
        if constants.HF_HUB_OFFLINE:
            raise ValueError(
                f"{model}: {rev} is not (completely) in the cache {cache} and HF_HUB_OFFLINE is"
                " set: download it there once with network access"
            ) from None
        raise ValueError(
            f"{model}: cannot reach {endpoint} ({_first_line(exc.__cause__ or exc)}) and {rev}"
            f" is not (completely) in the cache {cache}"
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise ValueError(
            f"{model}: {endpoint} answered HTTP {status} ({_first_line(exc)})"
        ) from None
    except Exception as exc:  # transport errors the hub client lets through (e.g. a proxy's)
        raise ValueError(f"{model}: download from {endpoint} failed ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
