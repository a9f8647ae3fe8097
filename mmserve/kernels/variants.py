"""The CPU kernel's instruction-set variants: which ones exist, which one a CPU runs, which ones
an install builds.

Imports nothing (no torch, no mmserve): ``setup.py`` loads this file by path to decide what to
compile, and ``mmserve.kernels`` loads the extension at run time from the same table, so the
variant an install builds by default is the one the loader picks on that machine.
"""

from __future__ import annotations

ENV_VAR = "MMSERVE_KERNEL_VARIANTS"

# variant -> compiler flags; each is built as the library mmserve/kernels/_C_<variant>.*.so,
# which registers its ops as torch.ops.<ops_namespace(variant)>
VARIANT_FLAGS: dict[str, tuple[str, ...]] = {
    # -mf16c: float16 <-> float32 in one instruction (every AVX2 CPU has F16C)
    "avx512": ("-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "generic": (),  # the compiler's baseline for the architecture
}
X86_MACHINES = ("x86_64", "amd64")


def ops_namespace(variant: str) -> str:
    """The torch.ops namespace of a variant's ops: one per variant, so that loading two variants
    into one process (the tests do) registers no op twice."""
    return f"mmserve_{variant}"


# torch's CPU capability (torch.backends.cpu.get_cpu_capability()) -> the variants it runs,
# widest first; any other capability runs "generic" only.
VARIANTS_BY_CAPABILITY: dict[str, tuple[str, ...]] = {
    "AVX512": ("avx512", "avx2", "generic"),
    "AVX512_BF16": ("avx512", "avx2", "generic"),
    "AMX": ("avx512", "avx2", "generic"),
    "AVX2": ("avx2", "generic"),
}


def runnable_variants(capability: str) -> tuple[str, ...]:
    """The variants a CPU of this torch capability runs, widest (preferred) first."""
    return VARIANTS_BY_CAPABILITY.get(capability, ("generic",))


def buildable_variants(machine: str) -> tuple[str, ...]:
    """The variants a compiler for this architecture (``platform.machine()``) can build."""
    return tuple(VARIANT_FLAGS) if machine.lower() in X86_MACHINES else ("generic",)


def variants_to_build(request: str | None, capability: str, machine: str) -> tuple[str, ...]:
    """The variants an install builds, given ``$MMSERVE_KERNEL_VARIANTS`` (``request``).

    Unset or empty: only the widest variant this CPU runs, the one ``mmserve.kernels`` loads
    here. ``all``: every variant of the architecture (an image that runs on other CPUs).
    ``none``: no kernels (a GPU machine, which does not run them; the pure-torch paths stay).
    Otherwise a comma-separated list of variant names (case and spaces ignored), built in that
    order. A name that is unknown or not of this architecture raises ValueError naming it.
    """
    buildable = buildable_variants(machine)
    names = [name.strip().lower() for name in (request or "").split(",") if name.strip()]
    if not names:
        return runnable_variants(capability)[:1]
    if names == ["none"]:
        return ()
    chosen: list[str] = []
    for name in names:
        if name == "all":
            chosen.extend(buildable)
        elif name in buildable:
            chosen.append(name)
        else:
            kind = "unknown" if name not in VARIANT_FLAGS else f"not buildable on {machine}"
            raise ValueError(
                f"{ENV_VAR}={request!r}: {kind} kernel variant {name!r} "
                f"(choose from {', '.join(buildable)}, all or none, comma-separated)"
            )
    return tuple(dict.fromkeys(chosen))


def parallel_jobs(max_jobs: str | None, cpus: int) -> int:
    """How many compiler processes run at once: ``$MAX_JOBS`` (torch's variable for the same
    thing) when set, else ``cpus``; at least 1. A value that is not a positive integer raises
    ValueError naming it."""
    if not max_jobs:
        return max(1, cpus)
    if not max_jobs.strip().isdigit() or int(max_jobs) < 1:
        raise ValueError(f"MAX_JOBS={max_jobs!r}: expected a positive number of compile jobs")
    return int(max_jobs)
