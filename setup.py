"""Builds mmserve's CPU kernels when torch is importable at build time: per instruction-set
variant one library of torch ops on torch's stable ABI (``mmserve/kernels/csrc/module.cpp``).

Install with ``pip install --no-build-isolation -e .`` after torch so the kernels compile
against the torch that will run them. Only the instruction-set variant this CPU runs is built
(the one ``mmserve.kernels`` loads here); ``MMSERVE_KERNEL_VARIANTS=all`` (or a list such as
``avx512,avx2``) builds more, for an image that runs on other CPUs
(``mmserve/kernels/variants.py``). Every source of every variant compiles at once, up to
``$MAX_JOBS`` compilers (default: the CPUs this process may use). Without torch or without a
C++ compiler at build time the package installs without kernels and mmserve uses its
pure-torch attention (``mmserve.kernels.unavailable_reason()`` says why).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import setup

# longest compile first: the pool starts them in this order
SOURCES = [
    "mmserve/kernels/csrc/paged_attention_decode.cpp",
    "mmserve/kernels/csrc/paged_attention_float.cpp",
    "mmserve/kernels/csrc/paged_attention_bf16.cpp",
    "mmserve/kernels/csrc/paged_attention_half.cpp",
    "mmserve/kernels/csrc/small_batch_linear.cpp",
    "mmserve/kernels/csrc/bf16_weight_linear.cpp",
    "mmserve/kernels/csrc/bf16_weight_pack.cpp",
    "mmserve/kernels/csrc/dense_attention_bf16.cpp",
    "mmserve/kernels/csrc/bf16_dot_linear.cpp",
    "mmserve/kernels/csrc/fused_ops.cpp",
    "mmserve/kernels/csrc/paged_attention.cpp",
    "mmserve/kernels/csrc/module.cpp",
]
HEADERS = [
    "mmserve/kernels/csrc/bf16_weight_tiles.h",
    "mmserve/kernels/csrc/ops.h",
    "mmserve/kernels/csrc/paged_attention_kernels.h",
    "mmserve/kernels/csrc/paged_attention_launch.h",
    "mmserve/kernels/csrc/paged_attention_prefill.h",
    "mmserve/kernels/csrc/simd.h",
]
# -g0: no debug info (Python's CFLAGS ask for -g): a third less compile time, a 60x smaller .so
# -O2: at -O3 the prefill tiles compiled 3x longer and ran no faster; the decode loops, which
# -O3 makes 1.7-2.5x faster, ask for it in their own file (paged_attention_decode.cpp)
# No -fopenmp: the kernels run on torch's thread pool (torch::stable::parallel_for)
COMMON_FLAGS = ["-O2", "-g0", "-ffp-contract=fast", "-Wno-psabi"]


def load_variants() -> ModuleType:
    """mmserve/kernels/variants.py, by path: importing mmserve would import its dependencies."""
    path = Path(__file__).resolve().parent / "mmserve" / "kernels" / "variants.py"
    spec = importlib.util.spec_from_file_location("_mmserve_kernel_variants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def compile_rank(source: str) -> int:
    return SOURCES.index(source) if source in SOURCES else len(SOURCES)


def parallel_build_ext(base: Any, jobs: int) -> Any:
    """``base`` (torch's BuildExtension) compiling all sources of all extensions on one pool of
    ``jobs`` compiler processes; extensions build side by side, so one links while the next
    compiles. The variants share their sources, so each writes its objects under a folder of
    its own name: sharing one folder, a variant's library could link another's objects."""
    building = threading.local()  # the extension this build thread is building

    class ParallelBuildExtension(base):
        def build_extension(self, ext: Any) -> None:
            building.name = ext.name.rsplit(".", 1)[-1]
            super().build_extension(ext)

        def build_extensions(self) -> None:
            self.parallel = len(self.extensions)  # threads that only wait on the pool
            compile_each = self.compiler.compile
            saved = os.environ.get("TORCH_NO_COMPILER_WRAPPER")
            # torch swaps the compiler command for each source (prepending ccache when found):
            # with sources compiling at once, one swap would wrap another's ("ccache ccache")
            os.environ["TORCH_NO_COMPILER_WRAPPER"] = "1"
            try:
                with ThreadPoolExecutor(jobs) as pool:

                    def compile_all(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
                        output_dir = kwargs.get("output_dir") or self.build_temp
                        kwargs["output_dir"] = os.path.join(output_dir, building.name)
                        futures = {
                            source: pool.submit(compile_each, [source], *args, **kwargs)
                            for source in sorted(sources, key=compile_rank)
                        }
                        return [obj for source in sources for obj in futures[source].result()]

                    self.compiler.compile = compile_all
                    super().build_extensions()
            finally:
                if saved is None:
                    os.environ.pop("TORCH_NO_COMPILER_WRAPPER", None)
                else:
                    os.environ["TORCH_NO_COMPILER_WRAPPER"] = saved

    return ParallelBuildExtension


def kernel_extensions() -> tuple[list[Any], dict[str, Any]]:
    variants = load_variants()
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("mmserve: torch not importable at build time; CPU kernels not built", file=sys.stderr)
        return [], {}
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        names = variants.variants_to_build(
            os.environ.get(variants.ENV_VAR), capability, platform.machine()
        )
        jobs = variants.parallel_jobs(os.environ.get("MAX_JOBS"), usable_cpus())
    except ValueError as exc:
        sys.exit(f"mmserve: {exc}")
    print(
        f"mmserve: CPU kernel variant(s) {', '.join(names)} for this CPU ({capability}), "
        f"{jobs} compile job(s)",
        file=sys.stderr,
    )
    extensions = [
        CppExtension(
            f"mmserve.kernels._C_{name}",
            SOURCES,
            depends=HEADERS,
            extra_compile_args=[
                *COMMON_FLAGS,
                *variants.VARIANT_FLAGS[name],
                f"-DMMSERVE_OPS_NAMESPACE={variants.ops_namespace(name)}",
            ],
            optional=True,  # a failed compile (no g++) leaves the pure-torch paths, not no install
        )
        for name in names
    ]
    build_ext = parallel_build_ext(BuildExtension.with_options(use_ninja=False), jobs)
    return extensions, {"build_ext": build_ext}


ext_modules, cmdclass = kernel_extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
