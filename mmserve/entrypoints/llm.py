"""Offline API: ``LLM.generate`` / ``LLM.chat`` / ``LLM.encode``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from tqdm import tqdm

from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.outputs import RequestOutput
from mmserve.engine.setup.chat_template import ChatTemplate
from mmserve.entrypoints.chat_utils import ChatOptions, chat_to_prompt
from mmserve.inputs import PromptInput
from mmserve.multimodal.handles import in_content_order, media_kinds
from mmserve.sampling_params import SamplingParams


class LLM:
    """Synchronous front door; keyword arguments are ``EngineArgs`` fields (plus
    ``allowed_local_path`` and ``media_policy``, see ``LLMEngine``)."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine.from_args(model, **engine_args)

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_metrics(self) -> dict[str, float]:
        return self.engine.get_metrics()

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """``prompts``: a str / token-id list / {"prompt" | "prompt_token_ids", "images",
        "videos" (decoded: ``VideoFrames``, PIL frame lists, [T, H, W, 3] uint8 arrays), "uuids",
        "cache_salt", "mm_processor_kwargs"} dict, or a list of them. Outputs come back in
        input order; a request that failed alone (its input broke a step) has finish_reason
        "error" and ``.error``."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        inputs = [PromptInput.of(p) for p in prompts]
        return self._run(inputs, sampling_params, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        cache_salt: str | None = None,
    ) -> list[RequestOutput]:
        """One conversation or a list of them, rendered with the engine's chat template (or
        ``chat_template``, the template text); the other options are vLLM's (``ChatOptions``;
        ``tools``: OpenAI function definitions for the template; ``mm_processor_kwargs``: image
        processor settings for these conversations' images; ``cache_salt``: the tenant, as
        the server's field). ``max_tokens`` unset: the room left in the context."""
        conversations = cast(
            list[list[dict[str, Any]]],
            messages if messages and isinstance(messages[0], list) else [messages],
        )
        template = self.engine.chat_template
        if chat_template is not None:
            model_type = getattr(self.engine.config.model.hf_config, "model_type", None)
            template = ChatTemplate.of(chat_template, "chat_template", model_type)
        options = ChatOptions(
            add_generation_prompt, continue_final_message, dict(chat_template_kwargs or {}), tools
        )
        tokenizer = self.engine.tokenizer
        inputs = [
            chat_to_prompt(tokenizer, conversation, cache_salt, template, options)
            for conversation in conversations
        ]
        for inp in inputs:
            inp.mm_processor_kwargs = mm_processor_kwargs
        return self._run(inputs, sampling_params, use_tqdm)

    def encode(
        self, content: list[dict[str, Any]], cache_salt: str | None = None
    ) -> list[dict[str, Any]]:
        """Encode images and videos ahead of the prompts that will use them (as ``POST
        /v1/mm/encode``): ``content`` is a user message's content parts (``image_url`` /
        ``image``, with an optional ``uuid``; ``video_url`` / ``video``); returns ``{"type":
        "image" | "video", "handle", "tokens"}`` per image and video, in content order. A later
        prompt of the same ``cache_salt`` names one by ``mmserve://<handle>`` (an image or video
        URL, or an item of a prompt dict's "images" or "videos") or an image by its ``uuid``
        without data."""
        messages = [{"role": "user", "content": content}]
        template = self.engine.chat_template
        prompt = chat_to_prompt(self.engine.tokenizer, messages, cache_salt, template)
        records = in_content_order(self.engine.encode(prompt), media_kinds(content))
        return [record.item for record in records]

    def _run(
        self,
        inputs: list[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = self.engine.default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(inputs)
        if not isinstance(sampling_params, (list, tuple)):
            raise ValueError(
                "sampling_params must be a SamplingParams or a list of them, one per prompt,"
                f" got {type(sampling_params).__name__} {sampling_params!r}"
            )
        for i, params in enumerate(sampling_params):
            if not isinstance(params, SamplingParams):
                raise ValueError(
                    "sampling_params must be a SamplingParams or a list of them, one per"
                    f" prompt, got {type(params).__name__} {params!r} at index {i}"
                )
        if len(sampling_params) != len(inputs):
            raise ValueError(
                f"got {len(sampling_params)} sampling params for {len(inputs)} prompts"
            )
        intake = self.engine.intake
        processed = intake.process_all(inputs, torch.get_num_threads())  # validate all first
        intake.wait_for_store(processed)  # the lookups all started above
        order: dict[str, int] = {}
        results: list[RequestOutput | None] = [None] * len(inputs)
        bar = tqdm(total=len(inputs), disable=not use_tqdm, desc="generate")
        try:  # a prompt failing its parameters' check leaves none of the batch queued
            for inp, proc, params in zip(inputs, processed, sampling_params, strict=True):
                text = inp.prompt if isinstance(inp.prompt, str) else None
                req_id = intake.add_processed(proc, params, None, text, inp.cache_salt)
                order[req_id] = len(order)
            while any(r is None for r in results):
                outs = self.engine.step()
                for out in outs:
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        bar.update(1)
        except BaseException:
            self.engine.abort_request([r for r in order if results[order[r]] is None])
            raise
        finally:
            bar.close()
        return results  # type: ignore[return-value]
