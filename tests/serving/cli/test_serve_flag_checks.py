"""``mmserve serve`` checks every flag in the CLI process, before anything loads or is deployed.

A bad setting (the engine's, its encoder store's, the server's, the Ray app's) or a missing
optional dependency is one ``error:`` line on stderr and exit code 2: no traceback, torch not
imported (no model loaded), Ray neither imported nor started (no deployment that fails in a
replica with only Ray's controller log knowing why). The subprocesses run ``main`` behind an
import tripwire on torch and Ray, so a check that comes too late fails the test at once
instead of starting a cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mmserve.cli import build_parser
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.listen_port import RAY_AGENT_PORT, check_listen_port, free_port

REDIS = "redis://127.0.0.1:1"  # nothing listens: the checks must not need a connection
SECRET = "a-secret-of-at-least-16-bytes"
RUN = """
import contextlib, io, json, sys

class Tripwire:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "ray"):
            raise RuntimeError(name + " was imported before the flags were checked")
        return None

sys.meta_path.insert(0, Tripwire())
for name in {missing!r}:
    sys.modules[name] = None  # as if the package were not installed
from mmserve.cli import main
results = []
for argv in {argvs!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        results.append((main(argv), err.getvalue()))
print(json.dumps(results))
"""


def run_cli(argvs: list[list[str]], missing: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """(exit code ``main`` returned, its stderr) of ``mmserve serve ARGV`` for each ARGV, one
    after another in one fresh process (a tripwire on importing torch or Ray)."""
    env = {k: v for k, v in os.environ.items() if k != "MMSERVE_ENCODER_STORE_SECRET"}
    code = RUN.format(argvs=[["serve", *argv] for argv in argvs], missing=missing)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out  # every main returned
    return [(rc, err) for rc, err in json.loads(out.stdout)]


def assert_one_line(result: tuple[int, str], named: str) -> None:
    rc, err = result
    assert rc == 2, result
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and named in err, err


def test_shared_redis_store_without_secret_fails_before_ray_starts() -> None:
    argv = ["tiny-llava", "--replicas", "2", "--encoder-store-redis", REDIS]
    [result] = run_cli([argv])
    assert_one_line(result, "--encoder-store-secret")


def test_missing_optional_packages_name_their_extra() -> None:
    store = ["tiny-llava", "--encoder-store-redis", REDIS, "--encoder-store-secret", SECRET]
    single, ray = run_cli([store, [*store, "--replicas", "2"]], missing=("redis",))
    assert_one_line(single, "pip install 'mmserve[store]'")
    assert_one_line(ray, "pip install 'mmserve[store]'")
    scale_out = [["--replicas", "2"], ["--ray-autoscaling", '{"max_replicas": 2}']]
    scale_out = [[*flags, "--port", "0"] for flags in scale_out]  # whether 8000 is free or not
    for result in run_cli([["tiny-llava", *flag] for flag in scale_out], missing=("ray",)):
        assert_one_line(result, "pip install 'mmserve[ray]'")


def bad_flag_cases(tmp: Path) -> list[tuple[list[str], str]]:
    """(flags, what the error line names): each fails late (or inside Ray) on main."""
    a_file = tmp / "not-a-directory"
    a_file.write_text("x")
    store = ["--encoder-store-redis", REDIS, "--encoder-store-secret"]
    return [
        (["--block-size", "0"], "block_size"),
        (["--max-num-seqs", "0"], "max_num_seqs"),
        (["--encoder-store-dir", str(a_file)], "encoder_store_dir"),
        (["--encoder-store-dir", str(a_file / "sub")], "encoder_store_dir"),
        (["--encoder-store-dir", str(tmp), "--encoder-store-ttl", "0"], "encoder_store_ttl"),
        (["--encoder-store-redis", "http://127.0.0.1:1"], "encoder_store_redis"),
        ([*store, "short"], "--encoder-store-secret"),
        (["--chat-template", str(tmp / "missing.jinja")], "--chat-template"),
        (["--generation-config", str(tmp / "missing")], "--generation-config"),
        (["--max-json-depth", "0"], "max_json_depth"),
        (["--allowed-local-media-path", str(tmp / "missing")], "--allowed-local-media-path"),
        (["--allowed-media-networks", "intranet"], "intranet"),
        (["--port", "70000"], "--port"),  # the socket calls wrap it to 4464
    ]


def test_bad_flags_fail_in_the_cli_before_anything_starts(tmp_path: Path) -> None:
    """Each case on Ray (``--replicas 2``) and on the single server."""
    cases = bad_flag_cases(tmp_path)
    modes = (["--replicas", "2"], [])
    argvs = [["tiny-llava", *mode, *flags] for mode in modes for flags, _ in cases]
    results = run_cli(argvs)
    for result, (_, named) in zip(results, cases * len(modes), strict=True):
        assert_one_line(result, named)


@pytest.mark.parametrize("replicas", [[], ["--replicas", "2"]])
def test_good_flags_pass_the_checks(replicas: list[str], tmp_path: Path) -> None:
    """The checks refuse only what is wrong: a full, valid store setup passes them."""
    from mmserve.entrypoints.openai.cli_args import validate_serve_flags

    if replicas:
        pytest.importorskip("ray.serve", reason="Ray Serve tests need the mmserve[ray] extra")
    argv = ["serve", "tiny-llava", *replicas, "--encoder-store-redis", REDIS]
    argv += ["--encoder-store-secret", SECRET, "--encoder-store-dir", str(tmp_path / "l2")]
    settings = validate_serve_flags(build_parser().parse_args(argv))
    assert settings.encoder_store_redis == REDIS
    assert not (tmp_path / "l2").exists()  # checked, not created (the replicas create it)


def test_library_names_the_store_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's store and the CLI run one check: without redis both name the extra."""
    from mmserve.extras import MissingExtra
    from mmserve.store.redis_tier import RedisTier

    monkeypatch.setitem(sys.modules, "redis", None)
    settings = EngineArgs(encoder_store_redis=REDIS, encoder_store_secret=SECRET)
    with pytest.raises(MissingExtra, match=r"pip install 'mmserve\[store\]'"):
        settings.validate()
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'mmserve\[store\]'"):
        RedisTier(REDIS, 10, 0.1)


def test_store_settings_fail_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Range checks of the frozen configs run when the settings are made (the library too)."""
    monkeypatch.delenv("MMSERVE_ENCODER_STORE_SECRET", raising=False)
    with pytest.raises(ValueError, match="block_size"):
        EngineArgs(block_size=0)
    with pytest.raises(ValueError, match="encoder_store_ttl"):
        EngineArgs(encoder_store_dir="/tmp/x", encoder_store_ttl=0)
    with pytest.raises(ValueError, match="encoder_store_secret"):
        EngineArgs(encoder_store_redis=REDIS).validate()
    monkeypatch.setenv("MMSERVE_ENCODER_STORE_SECRET", "too-short")
    with pytest.raises(ValueError, match="16 bytes"):
        EngineArgs(encoder_store_redis=REDIS).validate()
    monkeypatch.setenv("MMSERVE_ENCODER_STORE_SECRET", SECRET)
    EngineArgs(encoder_store_redis=REDIS).validate()  # the environment's secret is enough


def test_a_port_in_use_fails_before_anything_starts() -> None:
    """On main the single server loaded the model and then exited 3 on uvicorn's bind error,
    and ``--replicas`` started Ray and died in a traceback from Serve's proxy."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        modes = ([], ["--replicas", "2"])
        for result in run_cli([["tiny-llava", *mode, "--port", port] for mode in modes]):
            assert_one_line(result, f"--port {port}")
            assert "in use" in result[1], result


def test_the_port_a_local_ray_takes_for_itself_is_refused_before_ray_starts() -> None:
    """A CI run drew 52365 as a free port: the local Ray's dashboard agent took it first and
    Serve's proxy died binding it ("server exited during startup")."""
    [result] = run_cli([["tiny-llava", "--replicas", "2", "--port", str(RAY_AGENT_PORT)]])
    assert_one_line(result, f"--port {RAY_AGENT_PORT}")
    assert "dashboard agent" in result[1], result


def test_rays_agent_port_is_the_one_ray_uses() -> None:
    constants = pytest.importorskip("ray._private.ray_constants", reason="needs mmserve[ray]")
    assert constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT == RAY_AGENT_PORT


def test_a_free_port_or_port_zero_passes(tmp_path: Path) -> None:
    port = free_port()
    check_listen_port("127.0.0.1", port, local_ray=True)
    check_listen_port("127.0.0.1", 0, local_ray=True)
    check_listen_port("127.0.0.1", RAY_AGENT_PORT, local_ray=False)  # another Ray's business
    with pytest.raises(ValueError, match="--host"):
        check_listen_port("no-such-host.invalid", port, local_ray=False)


def test_a_ray_address_nobody_answers_at_fails_before_ray_starts() -> None:
    """On main Ray retried the address for minutes, printing a warning every few seconds (a
    CLI run waited over 3 minutes without an answer)."""
    port = free_port()  # nothing listens there
    argvs = [
        ["tiny-llava", "--replicas", "2", "--port", "0", "--ray-address", address]
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}")
    ]
    for result, argv in zip(run_cli(argvs), argvs, strict=True):
        assert_one_line(result, f"--ray-address {argv[-1]}")
        assert "no Ray cluster answers" in result[1], result


def test_rays_own_refusal_of_an_address_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ray-address auto`` with no cluster here: Ray's ConnectionError was a traceback."""
    pytest.importorskip("ray.serve", reason="needs mmserve[ray]")
    from mmserve.entrypoints.ray import launch

    def refuse(**_: object) -> None:
        raise ConnectionError("Could not find any running Ray instance.\nmore detail")

    monkeypatch.setattr(launch.ray, "init", refuse)
    args = build_parser().parse_args(["serve", "tiny-llava", "--replicas", "1"])
    args.ray_address = "auto"
    with pytest.raises(ValueError, match=r"^--ray-address auto: Could not find any running Ray"):
        launch.start_ray(args)
