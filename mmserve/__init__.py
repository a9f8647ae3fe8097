"""mmserve: a vision-language model inference engine that never does the same vision work twice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmserve.engine.outputs import CompletionOutput, RequestOutput
    from mmserve.entrypoints.llm import LLM
    from mmserve.sampling_params import SamplingParams
    from mmserve.structured_outputs import StructuredOutputsParams

__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
]
_EXPORTS = {
    "LLM": "mmserve.entrypoints.llm",
    "SamplingParams": "mmserve.sampling_params",
    "StructuredOutputsParams": "mmserve.structured_outputs",
    "RequestOutput": "mmserve.engine.outputs",
    "CompletionOutput": "mmserve.engine.outputs",
}


def __getattr__(name: str) -> Any:
    """Import lazily so ``mmserve --help`` does not pay for torch."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mmserve' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
