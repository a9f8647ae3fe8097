"""Hub model IDs (``ORG/NAME``) in the library: downloaded from a fake hub on 127.0.0.1 (only the
files mmserve reads), ``revision`` / ``download_dir``, the offline cache, one-line errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mmserve import LLM, SamplingParams
from mmserve.cli import build_parser
from mmserve.entrypoints.openai.cli_args import validate_serve_flags
from mmserve.models.checkpoint.hub import HUB_FILE_PATTERNS, is_hub_id
from mmserve.models.tiny import LAYOUT_NAMES, PRESET_NAMES, resolve_model_path
from tests.support.fake_hub import FakeHub, checkpoint_files, dead_endpoint, use_hub

EXTRA_FILES = {"pytorch_model.bin": b"\0" * 64, "README.md": b"# tiny\n", "model.onnx": b"\0"}
V2_GENERATION = {"max_new_tokens": 3, "eos_token_id": 2}


@pytest.fixture(scope="module")
def local_dir() -> Path:
    return resolve_model_path("tiny-llava")


@pytest.fixture(scope="module")
def hub(local_dir: Path) -> Iterator[FakeHub]:
    files = checkpoint_files(local_dir)
    with FakeHub() as fake:
        fake.add("org/tiny", {**files, **EXTRA_FILES})
        v2 = {**files, "generation_config.json": json.dumps(V2_GENERATION).encode()}
        fake.add("org/tiny", v2, revision="v2")
        fake.add("org/gated", files, gated=True)
        fake.add("org/no-weights", {"config.json": files["config.json"], **EXTRA_FILES})
        yield fake


@pytest.fixture
def cache(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """huggingface_hub pointed at the fake hub, its home and cache in ``tmp_path``."""
    return use_hub(monkeypatch, hub.url, tmp_path / "hf")


def test_no_preset_name_reads_as_a_hub_id() -> None:
    assert not any(is_hub_id(name) for name in PRESET_NAMES + LAYOUT_NAMES)
    assert is_hub_id("Qwen/Qwen2.5-VL-3B-Instruct") and is_hub_id("org/tiny")
    for name in ("tiny", "/abs/dir", "./org/tiny", "org/tiny/sub", "../x", "org/.."):
        assert not is_hub_id(name), name


def test_an_existing_local_directory_wins_over_the_hub(
    cache: Path, hub: FakeHub, tmp_path: Path, local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "tiny").symlink_to(local_dir)
    monkeypatch.chdir(tmp_path)
    seen = len(hub.requests)
    assert resolve_model_path("org/tiny") == local_dir.resolve()
    assert len(hub.requests) == seen


def test_llm_of_a_hub_id_downloads_only_what_it_reads_and_generates_as_the_local_dir(
    cache: Path, hub: FakeHub, local_dir: Path
) -> None:
    params = SamplingParams(temperature=0, max_tokens=8)
    prompts = ["USER: describe a red square ASSISTANT:", "hello there"]
    settings = {"max_num_seqs": 2}
    from_hub = LLM(model="org/tiny", **settings)
    path = from_hub.engine.config.model.path
    assert path.parent == cache / "models--org--tiny" / "snapshots"
    texts = [o.outputs[0].text for o in from_hub.generate(prompts, params, use_tqdm=False)]
    del from_hub
    local = LLM(model=str(local_dir), **settings)
    assert texts == [o.outputs[0].text for o in local.generate(prompts, params, use_tqdm=False)]
    assert all(texts)
    asked = hub.files_requested()
    assert not asked & set(EXTRA_FILES), asked  # not even a HEAD
    wanted = {name for name in checkpoint_files(local_dir) if name != "mmserve_preset.json"}
    assert hub.files_requested("GET") == wanted
    assert {p.name for p in path.iterdir()} == wanted


def test_revision_picks_that_commit(cache: Path, hub: FakeHub) -> None:
    path = resolve_model_path("org/tiny", revision="v2")
    assert path.name == hub.repos["org/tiny"].refs["v2"]
    assert json.loads((path / "generation_config.json").read_text()) == V2_GENERATION
    assert resolve_model_path("org/tiny").name == hub.repos["org/tiny"].refs["main"]


def test_download_dir_holds_the_snapshot(cache: Path, tmp_path: Path) -> None:
    target = tmp_path / "downloads"
    path = resolve_model_path("org/tiny", download_dir=str(target))
    assert path.is_relative_to(target.resolve()) and (path / "model.safetensors").is_file()
    assert not cache.exists()


@pytest.mark.parametrize(
    ("model", "revision", "expected"),
    [
        ("org/missing", None, "model 'org/missing': no such repository on http://127.0.0.1:"),
        ("org/gated", None, "model 'org/gated' is gated on http://127.0.0.1:"),
        ("org/tiny", "nope", "model 'org/tiny': revision 'nope' not found on http://127.0.0.1:"),
        ("org/no-weights", None, "model 'org/no-weights': the repository has no *.safetensors"),
    ],
)
def test_hub_failures_are_one_line_value_errors(
    cache: Path, model: str, revision: str | None, expected: str
) -> None:
    with pytest.raises(ValueError) as info:
        LLM(model=model, revision=revision)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value), info.value


def test_an_unreachable_endpoint_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = dead_endpoint()
    use_hub(monkeypatch, endpoint, tmp_path / "hf")
    with pytest.raises(ValueError) as info:
        resolve_model_path("org/tiny")
    message = str(info.value)
    assert (
        message.startswith(f"model 'org/tiny': cannot reach {endpoint} (") and "\n" not in message
    )


def test_offline_or_unreachable_uses_the_cache_and_names_what_is_missing(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "hf"
    online = resolve_model_path_with(monkeypatch, hub.url, home, offline=False)
    seen = len(hub.requests)
    assert resolve_model_path_with(monkeypatch, dead_endpoint(), home, offline=True) == online
    assert resolve_model_path_with(monkeypatch, dead_endpoint(), home, offline=False) == online
    assert len(hub.requests) == seen
    use_hub(monkeypatch, hub.url, tmp_path / "empty", offline=True)
    with pytest.raises(ValueError) as info:
        resolve_model_path("org/tiny")
    message = str(info.value)
    assert message.startswith("model 'org/tiny': revision 'main' is not (completely) in the cache")
    assert "HF_HUB_OFFLINE" in message and "\n" not in message
    assert len(hub.requests) == seen


def resolve_model_path_with(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, home: Path, offline: bool
) -> Path:
    use_hub(monkeypatch, endpoint, home, offline=offline)
    return resolve_model_path("org/tiny")


def test_serve_flags_resolve_once_and_keep_the_id(
    cache: Path, hub: FakeHub, tmp_path: Path
) -> None:
    """``--revision`` / ``--download-dir`` reach the download; the engine (and Ray replicas,
    which get these settings) is given the snapshot, the served name stays the ID."""
    target = tmp_path / "dl"
    argv = ["serve", "org/tiny", "--revision", "v2", "--download-dir", str(target)]
    args = build_parser().parse_args(argv)
    settings = validate_serve_flags(args)
    assert args.model == "org/tiny" and args.served_model_name is None
    assert settings.model == args.model_path
    assert Path(settings.model).name == hub.repos["org/tiny"].refs["v2"]
    assert Path(settings.model).is_relative_to(target.resolve())
    seen = len(hub.requests)
    assert validate_serve_flags(args) == settings and len(hub.requests) == seen


def test_allow_patterns_cover_the_files_a_checkpoint_is_read_from(local_dir: Path) -> None:
    from huggingface_hub.utils import filter_repo_objects

    names = [p.name for p in local_dir.iterdir()] + ["model-00001-of-00002.safetensors"]
    kept = set(filter_repo_objects(names, allow_patterns=list(HUB_FILE_PATTERNS)))
    assert kept == set(names) - {"mmserve_preset.json"}
    assert not set(filter_repo_objects(list(EXTRA_FILES), allow_patterns=list(HUB_FILE_PATTERNS)))


def test_bench_reads_hub_ids_like_any_model(cache: Path, local_dir: Path) -> None:
    from mmserve.bench.lib.engines.runners import architecture, model_max_len

    assert architecture("org/tiny") == architecture(str(local_dir))
    assert model_max_len("org/tiny") == model_max_len(str(local_dir))
