"""Precomputed image embeddings (vLLM's ``image_embeds``) in the offline API: the encoder's
own output given as embeddings answers as the image does and encodes nothing; the same tensor
again hits the prefix cache; a wrong shape, width, grid or type is a ValueError naming it."""

from __future__ import annotations

import pytest
import torch

from mmserve import LLM
from mmserve.inputs import ImageEmbeds
from tests.engine.handles.test_encode_handles import GREEDY, chat_of, data_url, encoded, image_part
from tests.support.engine import assert_no_leaks


@pytest.fixture(scope="module", params=["tiny-llava", "tiny-qwen2-vl", "tiny-gemma3"])
def llm(request) -> LLM:
    return LLM(request.param)


def encoder_output(llm: LLM, url: str) -> tuple[torch.Tensor, object]:
    """What the engine's vision encoder makes of ``url`` (and its Qwen-VL grid, else None)."""
    [item] = llm.encode([image_part(url)], cache_salt="encoder")
    embedding = llm.engine._host_embedding(f"{item['handle']}:{item['tokens']}")
    assert embedding is not None
    data = llm.engine.handles.kept._local[item["handle"]].image.data
    grid = data.get("image_grid_thw") if isinstance(data, dict) else None
    return embedding.clone(), grid


def embeds_part(embedding: torch.Tensor, grid: object) -> dict:
    value = embedding if grid is None else {"image_embeds": embedding, "image_grid_thw": grid}
    return {"type": "image_embeds", "image_embeds": value}


def test_the_encoders_output_as_image_embeds_answers_as_the_image(llm):
    url = data_url(11)
    embedding, grid = encoder_output(llm, url)
    sent = llm.chat(chat_of(image_part(url)), GREEDY, False, cache_salt="pixels")[0]
    before = encoded(llm)
    by_embeds = llm.chat(chat_of(embeds_part(embedding, grid)), GREEDY, False)[0]
    assert encoded(llm) - before == 0
    assert by_embeds.prompt_token_ids == sent.prompt_token_ids
    assert by_embeds.outputs[0].token_ids == sent.outputs[0].token_ids
    again = llm.chat(chat_of(embeds_part(embedding.clone(), grid)), GREEDY, False)[0]
    assert again.num_cached_tokens > 0  # keyed by the tensor: the prefix cache hits
    assert again.outputs[0].token_ids == sent.outputs[0].token_ids
    other = embedding.clone()
    other[0, 0] += 1.0  # another tensor is another key: no hit past the image
    moved = llm.chat(chat_of(embeds_part(other, grid)), GREEDY, False)[0]
    assert moved.num_cached_tokens < again.num_cached_tokens
    assert encoded(llm) - before == 0
    assert_no_leaks(llm)


def test_the_offline_prompt_takes_image_embeds(llm):
    """vLLM's offline shape: ``multi_modal_data={"image": ...}``, here an ``ImageEmbeds``."""
    from mmserve.entrypoints.chat_utils import chat_to_prompt

    url = data_url(12)
    embedding, grid = encoder_output(llm, url)
    chat = llm.chat(chat_of(embeds_part(embedding, grid)), GREEDY, False)[0]
    text = chat_to_prompt(llm.get_tokenizer(), chat_of(image_part(url)),
                          template=llm.engine.chat_template).prompt  # fmt: skip
    image = ImageEmbeds(embedding, grid)
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert out.prompt_token_ids == chat.prompt_token_ids
    assert out.outputs[0].token_ids == chat.outputs[0].token_ids


def test_wrong_image_embeds_are_value_errors_naming_them(llm):
    embedding, grid = encoder_output(llm, data_url(13))
    rows, width = embedding.shape
    cases = [
        (embedding[:-1], grid, f"has {rows - 1} rows"),
        (torch.zeros(rows, width + 1), grid, f"\\({rows}, {width + 1}\\)"),
        (embedding.to_sparse(), grid, "dense"),
        ("aGVsbG8=", grid, "--enable-mm-embeds"),
        (torch.full((rows, width), float("nan")), grid, "finite"),
        (embedding.long(), grid, "floating"),
    ]
    if grid is not None:
        cases.append((embedding, [1, 2, 2], "image_grid_thw"))
        cases.append((embedding, None, "image_grid_thw"))  # the count depends on the size
    for value, g, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.chat(chat_of(embeds_part(value, g)), GREEDY, False)  # type: ignore[arg-type]
    assert_no_leaks(llm)


def test_a_family_whose_count_depends_on_the_size_refuses_image_embeds():
    llm = LLM("tiny-llava-onevision")
    width = llm.engine.config.model.embedding_width or llm.engine.config.model.hidden_size
    part = {"type": "image_embeds", "image_embeds": torch.zeros(10, width)}
    with pytest.raises(ValueError, match="depends on the image size"):
        llm.chat(chat_of(part), GREEDY, False)
    assert_no_leaks(llm)
