"""mmserve: a vision-language model inference engine that never does the same vision work twice."""

from mmserve.engine.outputs import CompletionOutput, RequestOutput
from mmserve.entrypoints.llm import LLM
from mmserve.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
