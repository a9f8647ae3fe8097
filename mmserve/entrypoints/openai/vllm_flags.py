"""vLLM ``serve`` flags that mmserve has no setting for: refused with one line naming the flag,
or accepted as no-ops where their only effect is on logging or on hardware mmserve lacks.

The flags mmserve does implement (``--dtype``, ``--max-model-len``, ``--tensor-parallel-size``,
``--trust-remote-code``, ...) are ``EngineArgs`` fields or server flags; this table is only
for the rest, so a ``vllm serve`` command line fails fast and clearly instead of loading a
model with a setting silently dropped. Hidden from ``--help`` (docs/vllm-compatibility.md
lists them).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VLLMFlag:
    """One vLLM flag: the values mmserve accepts as no-ops and why the others fail."""

    names: tuple[str, ...]
    reason: str
    accepted: tuple[str, ...] | None = ()  # values meaning "what mmserve does anyway"; None: any
    takes_value: bool = True


VLLM_FLAGS: tuple[VLLMFlag, ...] = (
    VLLMFlag(("--pipeline-parallel-size", "-pp"), "mmserve runs a model on one device", ("1",)),
    VLLMFlag(("--data-parallel-size", "-dp"), "run one mmserve server per replica", ("1",)),
    VLLMFlag(("--quantization", "-q"), "mmserve has no quantized kernels", ("none",)),
    VLLMFlag(("--kv-cache-dtype",), "the KV cache uses the model's dtype", ("auto",)),
    VLLMFlag(("--load-format",), "mmserve loads safetensors", ("auto", "safetensors")),
    VLLMFlag(("--tokenizer",), "the tokenizer is read from the model directory"),
    VLLMFlag(("--tokenizer-revision",), "the tokenizer is read from the model's --revision"),
    VLLMFlag(("--hf-token",), "set $HF_TOKEN instead (huggingface_hub reads it)"),
    VLLMFlag(("--speculative-config",), "speculative decoding is not implemented"),
    VLLMFlag(("--enable-lora",), "LoRA adapters are not supported", takes_value=False),
    VLLMFlag(("--lora-modules",), "LoRA adapters are not supported"),
    VLLMFlag(("--cpu-offload-gb",), "weights stay on --device", ("0",)),
    VLLMFlag(("--swap-space",), "preempted requests are recomputed, never swapped", None),
    VLLMFlag(("--enable-chunked-prefill",), "mmserve always chunks prefills", None, False),
    VLLMFlag(("--disable-log-requests", "--disable-log-stats"),
             "mmserve logs no per-request lines nor periodic stats", None, False),
    VLLMFlag(("--enable-auto-tool-choice",),
             "tool_choice auto is always on (Hermes-format calls are parsed)", None, False),
    VLLMFlag(("--tool-call-parser",), "mmserve parses the Hermes tool-call format only",
             ("hermes",)),
)  # fmt: skip


class _VLLMFlagAction(argparse.Action):
    """Accepts the no-op values; anything else exits 2 with one line naming the flag."""

    def __init__(self, option_strings: Sequence[str], dest: str, spec: VLLMFlag, **kw: Any):
        self.spec = spec
        super().__init__(option_strings, dest, nargs=None if spec.takes_value else 0, **kw)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        value = values if self.spec.takes_value else ""
        if self.spec.accepted is None or value in self.spec.accepted:
            return
        shown = f"{option_string} {value}".strip()
        parser.exit(2, f"{parser.prog}: error: {shown} is not supported: {self.spec.reason}\n")


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """Register every flag of ``VLLM_FLAGS`` (hidden from the help)."""
    for spec in VLLM_FLAGS:
        parser.add_argument(
            *spec.names,
            action=_VLLMFlagAction,
            spec=spec,
            dest="vllm_" + spec.names[0].lstrip("-").replace("-", "_"),
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
