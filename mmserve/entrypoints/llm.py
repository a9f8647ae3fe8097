"""Offline API: ``LLM.generate`` / ``LLM.chat``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from tqdm import tqdm

from mmserve.engine.llm_engine import LLMEngine
from mmserve.engine.outputs import RequestOutput
from mmserve.entrypoints.chat_utils import parse_chat_messages, render_chat
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
        "uuids", "cache_salt"} dict, or a list of them. Outputs come back in input order; a request
        that failed alone (its input broke a step) has finish_reason "error" and ``.error``."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        inputs = [_as_input(p) for p in prompts]
        return self._run(inputs, sampling_params, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        conversations = cast(
            list[list[dict[str, Any]]],
            messages if messages and isinstance(messages[0], list) else [messages],
        )
        inputs = []
        for conversation in conversations:
            conv, images, uuids = parse_chat_messages(conversation)
            prompt = render_chat(self.engine.tokenizer, conv)
            has_uuids = any(u is not None for u in uuids)
            inputs.append((prompt, images, uuids if has_uuids else None, None))
        return self._run(inputs, sampling_params, use_tqdm)

    def _run(self, inputs, sampling_params, use_tqdm: bool) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(inputs)
        if len(sampling_params) != len(inputs):
            raise ValueError(
                f"got {len(sampling_params)} sampling params for {len(inputs)} prompts"
            )
        processed = [self.engine.process_inputs(*inp) for inp in inputs]  # validate all first
        order: dict[str, int] = {}
        for inp, proc, params in zip(inputs, processed, sampling_params, strict=True):
            text = inp[0] if isinstance(inp[0], str) else None
            req_id = self.engine.add_processed(proc, params, prompt_text=text, cache_salt=inp[3])
            order[req_id] = len(order)
        results: list[RequestOutput | None] = [None] * len(inputs)
        bar = tqdm(total=len(inputs), disable=not use_tqdm, desc="generate")
        try:
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


def _as_input(prompt: Any) -> tuple[Any, list[Any], list[str | None] | None, str | None]:
    """(prompt text or ids, images, uuids, cache_salt)."""
    if isinstance(prompt, (str, list)):
        return prompt, [], None, None
    if isinstance(prompt, dict):
        text = prompt.get("prompt", prompt.get("prompt_token_ids"))
        if text is None:
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        images = prompt.get("images", prompt.get("multi_modal_data", {}).get("image", []))
        if not isinstance(images, (list, tuple)):
            images = [images]
        return text, list(images), prompt.get("uuids"), prompt.get("cache_salt")
    raise ValueError(f"unsupported prompt of type {type(prompt).__name__}")
