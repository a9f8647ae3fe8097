"""The checks every admitted prompt passes, wherever it is admitted (the engine, the Ray
ingress): a valid tenant salt, room to generate, items that fit the encoder budgets."""

from __future__ import annotations

from collections.abc import Callable

from mmserve.inputs import ProcessedPrompt, PromptInput


def checked_prompt(
    process: Callable[[PromptInput], ProcessedPrompt],
    prompt: PromptInput,
    max_model_len: int,
    encoder_cache_capacity: int,
    encoder_budget: int,
) -> ProcessedPrompt:
    """``process(prompt)`` (the processor on one prompt) between the checks, in the one order
    both admission paths use: the salt before any work, the sizes after; the salt is
    recorded."""
    check_cache_salt(prompt.cache_salt)
    processed = process(prompt)
    processed.cache_salt = prompt.cache_salt
    check_prompt_fits(processed, max_model_len, encoder_cache_capacity, encoder_budget)
    return processed


def check_cache_salt(cache_salt: object) -> None:
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {cache_salt!r}")


def check_prompt_fits(
    processed: ProcessedPrompt, max_model_len: int, encoder_cache_capacity: int, encoder_budget: int
) -> None:
    """ValueError when the prompt leaves no room to generate, or an image / video frame group
    needs more embeddings than the encoder cache or the per-step encoder budget holds."""
    n = len(processed.prompt_token_ids)
    if n >= max_model_len:
        raise ValueError(
            f"prompt has {n} tokens, the model's max length is {max_model_len}"
            " (including at least one generated token)"
        )
    for item in processed.mm_items:
        if item.length > min(encoder_cache_capacity, encoder_budget):
            what = "an image" if item.video is None else "a video frame group"
            raise ValueError(
                f"{what} needs {item.length} embeddings, more than the encoder cache"
                f" ({encoder_cache_capacity}) or the per-step encoder budget ({encoder_budget})"
            )
