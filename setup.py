"""Builds mmserve's CPU kernels (C++ torch extensions) when torch is importable at build time.

Install with ``pip install --no-build-isolation -e .`` after torch so the extension compiles
against the torch that will run it; without torch at build time the package installs without
kernels and mmserve uses its pure-torch attention (``mmserve.kernels`` says why).
"""

from __future__ import annotations

import platform
import sys

from setuptools import setup

SOURCES = [
    "mmserve/kernels/csrc/module.cpp",
    "mmserve/kernels/csrc/paged_attention.cpp",
    "mmserve/kernels/csrc/fused_ops.cpp",
]
HEADERS = ["mmserve/kernels/csrc/ops.h", "mmserve/kernels/csrc/paged_attention_kernels.h"]
COMMON_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast", "-Wno-psabi"]
X86_VARIANTS = {
    "avx512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
}


def kernel_extensions() -> tuple[list, dict]:
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("mmserve: torch not importable at build time; CPU kernels not built", file=sys.stderr)
        return [], {}
    machine = platform.machine().lower()
    variants = X86_VARIANTS if machine in ("x86_64", "amd64") else {"generic": []}
    extensions = [
        CppExtension(
            f"mmserve.kernels._C_{name}",
            SOURCES,
            depends=HEADERS,
            extra_compile_args=COMMON_FLAGS + flags,
            extra_link_args=["-fopenmp"],
        )
        for name, flags in variants.items()
    ]
    return extensions, {"build_ext": BuildExtension.with_options(use_ninja=False)}


ext_modules, cmdclass = kernel_extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
