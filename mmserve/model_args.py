"""``ModelArgs``: the model's settings declared once (name, type, default, help), the first
fields of ``EngineArgs``.

Which checkpoint (a preset, a directory or a hub ID with its revision and download directory),
its dtype, device and attention backend, its context length, its processor, chat template and
sampling defaults, and the engine seed: vLLM's ``ModelConfig`` settings. ``EngineArgs``
extends it with the caches', the scheduler's, the encoder store's and the decode graphs'
settings; only ``EngineArgs`` is taken by ``LLM(...)``, the engine and the CLI. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmserve.arg_fields import arg_field, env_arg_field
from mmserve.arg_types import human_readable_int_or_auto, parse_json_object
from mmserve.arg_values import read_field_values
from mmserve.config import ATTENTION_BACKENDS, check_device_syntax

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # vLLM's --dtype values
DTYPE_ALIASES = {"half": "float16", "float": "float32"}


@dataclass
class ModelArgs:
    """The model's settings; ``EngineArgs`` subclasses it, so these are its first fields.

    Invariants once built: ``dtype`` is one of ``DTYPES`` with vLLM's aliases resolved (half:
    float16, float: float32) and ``device`` is well-formed (``config.check_device_syntax``).
    """

    model: str = arg_field(
        "tiny-llava", "preset name, HF checkpoint dir or hub model ID (ORG/NAME)"
    )
    revision: str | None = arg_field(
        None, "hub model IDs: the branch, tag or commit to download (None: the repository's"
        " default branch; a private or gated repository needs $HF_TOKEN)",
    )  # fmt: skip
    download_dir: str | None = arg_field(
        None, "hub model IDs: the cache directory to download into and load from (None:"
        " huggingface_hub's cache, $HF_HUB_CACHE or $HF_HOME/hub; with $HF_HUB_OFFLINE=1 only"
        " the cache is read)", metavar="DIR",
    )  # fmt: skip
    dtype: str = env_arg_field(
        "MMSERVE_DTYPE", "auto", "weights / activations: 'auto' is on CPU the checkpoint's half"
        " dtype where the CPU runs it natively (bfloat16: AVX-512 BF16 or AMX; float16:"
        " AVX-512 FP16 or AMX-FP16), else float32, and on CUDA the checkpoint's half dtype,"
        " else bfloat16; the start-up log says which; half = float16, float = float32",
        choices=DTYPES,
    )  # fmt: skip
    seed: int = arg_field(0, "engine seed (sampling without a per-request seed)")
    device: str = env_arg_field(
        "MMSERVE_DEVICE", "auto", "auto (CUDA when torch sees a GPU, else CPU), cpu, cuda or"
        " cuda:N", metavar="auto|cpu|cuda[:N]",
    )  # fmt: skip
    attention_backend: str = arg_field(
        "auto",
        "LM attention: 'cpu-kernel' (compiled, reads the paged KV cache in place; CPU float32),"
        " 'torch' (gather + SDPA, any device/dtype), 'flex' (torch flex_attention over the paged"
        " cache, no gathered copies; compiled on CUDA), 'auto' (the kernel where it applies,"
        " else torch)",
        choices=ATTENTION_BACKENDS,
    )
    max_model_len: int | None = arg_field(
        None, "context length, e.g. 4096, 4k (4000), 4K (4096); auto or -1: the model config's",
        type=human_readable_int_or_auto,
    )  # fmt: skip
    processor_kwargs: dict[str, Any] | None = arg_field(
        None, "HF image processor overrides as JSON, e.g. '{\"max_pixels\": 401408}'"
        " (vLLM's --mm-processor-kwargs)",
        type=parse_json_object, aliases=("--mm-processor-kwargs",),
    )  # fmt: skip
    chat_template: str | None = arg_field(
        None, "chat template file or template text (default: the checkpoint's chat_template.jinja,"
        " chat_template.json, tokenizer or processor config)",
        metavar="PATH|TEMPLATE",
    )  # fmt: skip
    generation_config: str = arg_field(
        "auto", "sampling defaults: 'auto' (the checkpoint's generation_config.json), 'vllm'"
        " (ignore it) or a directory holding a generation_config.json",
        metavar="auto|vllm|DIR",
    )  # fmt: skip

    def __post_init__(self) -> None:
        """Normalise vLLM's dtype aliases and check the device's syntax (ValueError naming the
        setting); ``EngineArgs.__post_init__`` runs this first. Every field's value is read as
        its type says first (``arg_values``); a torch dtype, as vLLM's ``LLM`` takes one, is its
        name."""
        if not isinstance(self.dtype, str) and str(self.dtype).startswith("torch."):
            self.dtype = str(self.dtype).removeprefix("torch.")
        read_field_values(self)
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        check_device_syntax(self.device)
