"""How the device's memory is split on CUDA: weights, peak activations, decode graphs, encoder
cache, KV cache.

Pure arithmetic over measured numbers (``MemoryPlan.of``), so the policy is unit-tested with
fake device-memory figures; ``memory_profile.py`` measures them on a real device.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class DeviceMemoryUsage:
    """What a profiling pass measured, in bytes.

    ``total``: the device's memory; ``used_elsewhere``: memory in use outside this process's
    torch allocator when profiling (CUDA context, other processes); ``weights``: the loaded
    model; ``peak_activations``: the allocator's peak during the profiling forward above the
    weights (LM prefill of a full token budget + a full encoder batch + logits);
    ``cuda_graphs``: what the decode graphs keep (their buffers and the one pool they share,
    measured as an eager run of the largest bucket, plus the KV cache's pad block), 0 without.
    """

    total: int
    used_elsewhere: int
    weights: int
    peak_activations: int
    cuda_graphs: int = 0


@dataclass(frozen=True)
class MemoryPlan:
    """``budget = utilization x total``; the KV cache gets what the budget leaves after memory
    used elsewhere, the weights, the peak activations, the decode graphs and the encoder cache,
    in whole blocks (capped at ``wanted_blocks``: max_num_seqs full-length sequences)."""

    budget: int
    usage: DeviceMemoryUsage
    encoder_cache: int
    bytes_per_block: int
    num_kv_blocks: int

    @property
    def kv_cache(self) -> int:
        return self.num_kv_blocks * self.bytes_per_block

    @classmethod
    def of(
        cls,
        usage: DeviceMemoryUsage,
        utilization: float,
        encoder_cache: int,
        bytes_per_block: int,
        wanted_blocks: int,
    ) -> MemoryPlan:
        """ValueError naming ``gpu_memory_utilization`` when not even one block fits."""
        if not 0 < utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
        budget = int(usage.total * utilization)
        left = budget - usage.used_elsewhere - usage.weights - usage.peak_activations
        left -= usage.cuda_graphs + encoder_cache
        if left < bytes_per_block:
            parts = {
                "used elsewhere": usage.used_elsewhere,
                "weights": usage.weights,
                "peak activations": usage.peak_activations,
                "CUDA graphs": usage.cuda_graphs,
                "encoder cache": encoder_cache,
            }
            taken = ", ".join(f"{name} {n / MiB:.0f} MiB" for name, n in parts.items())
            raise ValueError(
                f"no device memory left for the KV cache: gpu_memory_utilization={utilization}"
                f" of {usage.total / MiB:.0f} MiB is {budget / MiB:.0f} MiB, and {taken};"
                " raise gpu_memory_utilization or lower max_num_batched_tokens /"
                " encoder_cache_memory (CUDA graphs: max_seq_len_to_capture, or enforce_eager)"
            )
        return cls(
            budget,
            usage,
            encoder_cache,
            bytes_per_block,
            min(wanted_blocks, left // bytes_per_block),
        )

    def summary(self, block_size: int) -> str:
        """The start-up line saying what was chosen."""
        u = self.usage
        return (
            f"device memory: {u.total / MiB:.0f} MiB, budget {self.budget / MiB:.0f} MiB"
            f" (gpu_memory_utilization); used elsewhere {u.used_elsewhere / MiB:.0f} MiB,"
            f" weights {u.weights / MiB:.0f} MiB, peak activations"
            f" {u.peak_activations / MiB:.0f} MiB, CUDA graphs {u.cuda_graphs / MiB:.0f} MiB,"
            f" encoder cache {self.encoder_cache / MiB:.0f}"
            f" MiB, KV cache {self.kv_cache / MiB:.0f} MiB = {self.num_kv_blocks} blocks"
            f" ({self.num_kv_blocks * block_size} tokens)"
        )
