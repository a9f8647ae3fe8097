"""Which CPU kernel variants an install builds (``mmserve/kernels/variants.py``, read by
``setup.py``): by default only the one this CPU runs, the one the loader then finds;
``MMSERVE_KERNEL_VARIANTS`` builds more; a bad value stops the install with one line."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmserve.kernels import cpu_ops, unavailable_reason
from mmserve.kernels.variants import (
    ENV_VAR,
    VARIANT_FLAGS,
    parallel_jobs,
    runnable_variants,
    variants_to_build,
)

SETUP_PY = Path(__file__).resolve().parents[2] / "setup.py"


@pytest.mark.parametrize(
    ("capability", "machine", "expected"),
    [
        ("AVX512", "x86_64", "avx512"),
        ("AVX512_BF16", "x86_64", "avx512"),
        ("AMX", "AMD64", "avx512"),
        ("AVX2", "x86_64", "avx2"),
        ("DEFAULT", "x86_64", "generic"),  # an x86 CPU without AVX2
        ("SVE256", "aarch64", "generic"),
        ("DEFAULT", "arm64", "generic"),
    ],
)
def test_default_builds_only_the_variant_the_loader_picks(capability, machine, expected):
    for request in (None, "", " , "):
        assert variants_to_build(request, capability, machine) == (expected,)
    assert runnable_variants(capability)[0] == expected  # the loader tries it first


def test_all_and_lists_build_more():
    assert variants_to_build("all", "AVX2", "x86_64") == ("avx512", "avx2", "generic")
    assert variants_to_build("none", "AVX2", "x86_64") == ()  # e.g. a GPU machine
    assert variants_to_build("all", "DEFAULT", "aarch64") == ("generic",)
    assert variants_to_build("avx512,avx2", "AVX2", "x86_64") == ("avx512", "avx2")
    assert variants_to_build(" AVX2 , avx2,generic", "AVX512", "x86_64") == ("avx2", "generic")
    assert variants_to_build("avx2,all", "AVX2", "x86_64") == ("avx2", "avx512", "generic")
    assert set(variants_to_build("all", "AVX2", "x86_64")) == set(VARIANT_FLAGS)


def test_a_bad_variant_is_named():
    with pytest.raises(ValueError, match=r"MMSERVE_KERNEL_VARIANTS='avx2,avx9': unknown .*'avx9'"):
        variants_to_build("avx2,avx9", "AVX2", "x86_64")
    with pytest.raises(ValueError, match=r"'avx512' .*choose from generic, all or none"):
        variants_to_build("avx512", "DEFAULT", "aarch64")


def test_parallel_jobs_from_max_jobs():
    assert parallel_jobs(None, 2) == 2
    assert parallel_jobs("", 16) == 16
    assert parallel_jobs("3", 2) == 3
    assert parallel_jobs(None, 0) == 1
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match=f"MAX_JOBS='{bad}'"):
            parallel_jobs(bad, 2)


def test_the_loader_finds_the_variant_a_default_install_builds_here():
    assert cpu_ops() is not None, unavailable_reason()
    capability = torch.backends.cpu.get_cpu_capability()
    (built,) = variants_to_build(None, capability, platform.machine())
    assert cpu_ops().variant == built


def run_setup_py(variants: str | None) -> subprocess.CompletedProcess[str]:
    """``setup.py --name`` decides what to build (and stops on a bad request) without building."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if variants is not None:
        env[ENV_VAR] = variants
    return subprocess.run(
        [sys.executable, str(SETUP_PY), "--name"],
        cwd=SETUP_PY.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_setup_py_builds_this_cpus_variant_or_what_the_env_var_asks_for():
    capability = torch.backends.cpu.get_cpu_capability()
    default = run_setup_py(None)
    assert default.returncode == 0, default.stderr
    (variant,) = variants_to_build(None, capability, platform.machine())
    assert f"CPU kernel variant(s) {variant} for this CPU ({capability})" in default.stderr
    asked = run_setup_py("all")
    assert asked.returncode == 0, asked.stderr
    every = ", ".join(variants_to_build("all", capability, platform.machine()))
    assert f"CPU kernel variant(s) {every} for" in asked.stderr


def test_setup_py_refuses_a_bad_variant_in_one_line():
    result = run_setup_py("avx2,fast")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "fast" in line]
    assert lines == [
        f"mmserve: {ENV_VAR}='avx2,fast': unknown kernel variant 'fast' "
        f"(choose from {', '.join(variants_to_build('all', 'AVX2', platform.machine()))}"
        ", all or none, comma-separated)"
    ], result.stderr


def test_without_a_compiler_the_package_still_builds_and_says_why(tmp_path):
    """A failed kernel compile (here: no C++ compiler) leaves the pure-torch paths, not a failed
    install; the loader's reason names what the build needs."""
    root = SETUP_PY.parent
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, tmp_path / name)
    shutil.copytree(
        root / "mmserve", tmp_path / "mmserve", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    env = {**os.environ, "CC": "/nonexistent/gcc", "CXX": "/nonexistent/g++"}
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "--build-temp", "tmp"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert not list((tmp_path / "mmserve" / "kernels").glob("_C_*"))
    probe = "import mmserve.kernels as k; print(k.cpu_ops(), k.unavailable_reason())"
    reason = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reason.stdout.startswith("None no CPU kernel for capability"), reason.stderr[-2000:]
    assert "C++ compiler" in reason.stdout and f"{ENV_VAR}=all" in reason.stdout


FAKE_COMPILER = """#!{python}
import sys, time
args = sys.argv[1:]
if "-o" not in args:  # torch asks for the compiler's version
    print("g++ (GCC) 12.2.0")
    sys.exit(0)
out = args[args.index("-o") + 1]
if "-c" in args:  # an object file records the variant its flags name
    name = next(a for a in args if a.startswith("-DTORCH_EXTENSION_NAME="))
    time.sleep(0.3)  # long enough for another variant's compile of the same source to overlap
    open(out, "w").write(name + "\\n")
elif "-shared" in args:  # a library is its objects, concatenated
    objects = [a for a in args if a.endswith(".o")]
    open(out, "w").write("".join(open(o).read() for o in objects))
"""


def test_variants_built_together_keep_their_own_objects(tmp_path):
    """``MMSERVE_KERNEL_VARIANTS=all`` compiles the same sources once per variant, side by side:
    each variant's objects go to their own folder, so one variant's library never links another
    variant's objects (an AVX-512 object in the AVX2 library would crash an AVX2 CPU)."""
    root = SETUP_PY.parent
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, tmp_path / name)
    shutil.copytree(
        root / "mmserve", tmp_path / "mmserve", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    compiler = tmp_path / "fake-c++"
    compiler.write_text(FAKE_COMPILER.format(python=sys.executable))
    compiler.chmod(0o755)
    env = {
        **os.environ,
        ENV_VAR: "all",
        "MAX_JOBS": "6",
        "CC": str(compiler),
        "CXX": str(compiler),
        "LDSHARED": f"{compiler} -shared",
    }
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "--build-temp", "tmp"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    names = variants_to_build("all", torch.backends.cpu.get_cpu_capability(), platform.machine())
    assert len(names) > 1
    for name in names:
        (library,) = (tmp_path / "mmserve" / "kernels").glob(f"_C_{name}.*")
        flags = set(library.read_text().split())
        assert flags == {f"-DTORCH_EXTENSION_NAME=_C_{name}"}, (name, flags)
