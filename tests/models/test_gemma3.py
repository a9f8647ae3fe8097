"""Gemma 3 (images): greedy output token-identical to transformers' Gemma3ForConditionalGeneration
(float32, eager attention, ``token_type_ids`` from its processor) on the tiny preset, whose
8-token sliding window and 16-token images make both masks matter, under every cache setting;
plus the start-up checks its attention imposes."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmserve import LLM, SamplingParams
from mmserve.models.tiny import resolve_model_path
from tests.support.engine import assert_no_leaks

MODEL = "tiny-gemma3"
IMAGE_TOKENS = 16  # mm_tokens_per_image of the preset
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)


class GemmaReference:
    """transformers' Gemma 3 and its own processor (``Gemma3Processor``): the ground truth."""

    def __init__(self) -> None:
        from transformers import AutoProcessor, Gemma3ForConditionalGeneration

        path = resolve_model_path(MODEL)
        self.processor = AutoProcessor.from_pretrained(path)
        self.model = Gemma3ForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager"
        ).eval()

    def inputs(self, prompt: str, images: list[Image.Image], **kwargs: object) -> dict:
        return self.processor(text=prompt, images=images or None, return_tensors="pt", **kwargs)

    def greedy(self, prompt: str, images: list[Image.Image]) -> list[int]:
        inputs = self.inputs(prompt, images)
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def gemma_ref() -> GemmaReference:
    return GemmaReference()


def turn(text: str, n_images: int = 0) -> str:
    """One user turn as Gemma 3's chat template writes it (the tokenizer adds <bos>)."""
    images = "<start_of_image>" * n_images
    return f"<start_of_turn>user\n{images}{text}<end_of_turn>\n<start_of_turn>model\n"


def cases(images: list[Image.Image]) -> list[tuple[str, list[Image.Image]]]:
    return [
        (turn("Describe this picture.", 1), images[:1]),
        (turn("Compare the two pictures, then tell me which one is brighter.", 2), images[1:3]),
        (turn("Tell me a long story about a red cube that met a blue ball in a park."), []),
        (
            "<start_of_turn>user\nFirst look at this one <start_of_image> and now this one"
            " <start_of_image> and say what changed between them.<end_of_turn>\n"
            "<start_of_turn>model\n",
            [images[3], images[0]],
        ),
    ]


def check_parity(llm: LLM, ref: GemmaReference, batch: list[tuple[str, list]]) -> list:
    outs = llm.generate([{"prompt": p, "images": i} for p, i in batch], GREEDY, use_tqdm=False)
    for (prompt, imgs), out in zip(batch, outs, strict=True):
        inputs = ref.inputs(prompt, imgs)
        assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
        assert out.outputs[0].token_ids == ref.greedy(prompt, imgs), prompt
    assert_no_leaks(llm)
    return outs


CACHE_SETTINGS = {
    "default": {},
    "encoder-cache-off": {"enable_encoder_cache": False},
    "prefix-cache-off": {"enable_prefix_caching": False},
    # chunks of 17 tokens: each chunk is cut back to the next image's start
    "small-chunks": {"max_num_batched_tokens": IMAGE_TOKENS + 1, "block_size": 4},
    "preemption": {"num_kv_blocks": 40, "block_size": 4, "max_model_len": 160},
}


@pytest.mark.parametrize("setting", sorted(CACHE_SETTINGS))
def test_parity_under_cache_settings(gemma_ref, images, setting):
    llm = LLM(MODEL, seed=0, **CACHE_SETTINGS[setting])
    check_parity(llm, gemma_ref, cases(images))
    if setting == "preemption":
        assert llm.get_metrics()["num_preemptions"] > 0


def test_prefix_hit_sharing_an_image(gemma_ref, images):
    llm = LLM(MODEL, seed=0, block_size=4)
    check_parity(llm, gemma_ref, [(turn("Describe this picture.", 1), images[:1])])
    prompt = turn("What colors are in it?", 1)
    second = check_parity(llm, gemma_ref, [(prompt, images[:1])])
    ids = gemma_ref.inputs(prompt, images[:1])["input_ids"][0].tolist()
    image_end = ids.index(gemma_ref.model.config.image_token_id) + IMAGE_TOKENS
    assert second[0].num_cached_tokens >= image_end - 4  # the blocks through the image


def test_prefix_hit_ending_inside_an_image(gemma_ref, images):
    """The hit's image tokens were computed with their whole image (never split), so their KV
    is reused and the rest of the image runs in one chunk, seeing all of it."""
    full = turn("Describe this picture.", 1)
    short = "<start_of_turn>user\n<start_of_image>"  # ends right after the image sequence
    ids = gemma_ref.inputs(short, images[:1])["input_ids"][0].tolist()
    image_start = ids.index(gemma_ref.model.config.image_token_id)
    image_end = image_start + IMAGE_TOKENS
    block_size = next(
        bs for bs in (4, 8, 16) if image_start < (len(ids) - 1) // bs * bs < image_end
    )
    llm = LLM(MODEL, seed=0, block_size=block_size)
    check_parity(llm, gemma_ref, [(full, images[:1])])
    out = check_parity(llm, gemma_ref, [(short, images[:1])])[0]
    assert image_start < out.num_cached_tokens < image_end


def test_an_image_larger_than_the_token_budget_fails_at_start_up():
    with pytest.raises(ValueError, match="raise max_num_batched_tokens to at least 16"):
        LLM(MODEL, max_num_batched_tokens=IMAGE_TOKENS - 1)


def test_the_causal_cpu_kernel_is_refused():
    with pytest.raises(ValueError, match="causal only; the model needs Gemma 3's sliding-window"):
        LLM(MODEL, attention_backend="cpu-kernel")


PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16}


def test_pan_and_scan_crops_are_extra_images_of_the_request(gemma_ref, images):
    """With pan-and-scan on, the wide and the tall image get two crops each (the square one
    none): each crop is its own run of image tokens, its own bidirectional group and its own
    encoder-cache entry (``<image key>#<crop>``), encoded from the same prepared image."""
    # prefix caching off, so the second request takes the embeddings from the encoder cache
    llm = LLM(MODEL, seed=0, processor_kwargs=PAN_AND_SCAN, enable_prefix_caching=False)
    prompt = turn("Compare all three.", 3)
    batch = [images[2], images[3], images[1]]  # 120x50, 70x90, 64x64
    inputs = gemma_ref.inputs(prompt, batch, **PAN_AND_SCAN)
    assert inputs["pixel_values"].shape[0] == 3 + 3 + 1
    out = llm.generate([{"prompt": prompt, "images": batch}], GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
    with torch.inference_mode():
        want = gemma_ref.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    assert out.outputs[0].token_ids == want[0, inputs["input_ids"].shape[1] :].tolist()
    again = llm.generate([{"prompt": turn("And now?", 1), "images": [images[2]]}], GREEDY)
    assert again[0].outputs[0].token_ids
    metrics = llm.get_metrics()
    assert metrics["encoder_cache_hits"] == 3  # the wide image and its two crops
    assert_no_leaks(llm)


def test_token_id_prompts(gemma_ref, images):
    """A token-id prompt may hold the processor's expansion already (used as is) or bare
    ``<start_of_image>`` tokens, which mmserve expands token-wise."""
    llm = LLM(MODEL, seed=0)
    prompt = turn("Describe this picture.", 1)
    expanded = gemma_ref.inputs(prompt, images[:1])["input_ids"][0].tolist()
    bare = gemma_ref.processor.tokenizer(prompt)["input_ids"]
    outs = llm.generate(
        [
            {"prompt_token_ids": expanded, "images": images[:1]},
            {"prompt_token_ids": bare, "images": images[:1]},
        ],
        GREEDY,
        use_tqdm=False,
    )
    assert outs[0].prompt_token_ids == expanded
    assert outs[0].outputs[0].token_ids == gemma_ref.greedy(prompt, images[:1])
    image_token = gemma_ref.model.config.image_token_id
    ids = torch.tensor([outs[1].prompt_token_ids])
    assert int((ids == image_token).sum()) == IMAGE_TOKENS and len(ids[0]) > len(bare)
    pixels = gemma_ref.processor.image_processor(images=images[:1], return_tensors="pt")
    with torch.inference_mode():
        want = gemma_ref.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            token_type_ids=(ids == image_token).long(),
            pixel_values=pixels["pixel_values"],
            max_new_tokens=MAX_NEW,
            do_sample=False,
        )
    assert outs[1].outputs[0].token_ids == want[0, ids.shape[1] :].tolist()


def test_chat_matches_apply_chat_template(gemma_ref, images):
    """The published template writes <bos>; the prompt still has exactly one, as transformers'
    ``apply_chat_template(tokenize=True)`` gives."""
    llm = LLM(MODEL, seed=0)
    question = [{"type": "text", "text": "What is in this picture?"}]
    out = llm.chat(
        [{"role": "user", "content": [{"type": "image", "image": images[0]}, *question]}],
        GREEDY,
        use_tqdm=False,
    )[0]
    inputs = gemma_ref.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image", "image": images[0]}, *question]}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
    with torch.inference_mode():
        want = gemma_ref.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    assert out.outputs[0].token_ids == want[0, inputs["input_ids"].shape[1] :].tolist()


def test_pan_and_scan_per_request(gemma_ref, images):
    llm = LLM(MODEL, seed=0, processor_kwargs={"pan_and_scan_min_crop_size": 16})
    prompt = turn("Describe this picture.", 1)
    request = {"prompt": prompt, "images": images[2:3]}
    plain, cropped = llm.generate(
        [request, {**request, "mm_processor_kwargs": {"do_pan_and_scan": True}}],
        GREEDY,
        use_tqdm=False,
    )
    inputs = gemma_ref.inputs(prompt, images[2:3], **PAN_AND_SCAN)
    assert cropped.prompt_token_ids == inputs["input_ids"][0].tolist()
    assert len(plain.prompt_token_ids) < len(cropped.prompt_token_ids)
    with pytest.raises(ValueError, match="do_pan_and_scan must be true or false"):
        llm.generate([{**request, "mm_processor_kwargs": {"do_pan_and_scan": "yes"}}], GREEDY)


def test_soft_capping_is_ignored_as_in_transformers(tmp_path, images):
    """transformers' Gemma3ForConditionalGeneration applies neither ``attn_logit_softcapping``
    nor ``final_logit_softcapping`` (only the text-only Gemma3ForCausalLM caps logits): with
    both set, tokens and logprobs still equal the reference's."""
    import json
    import shutil

    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    path = tmp_path / "capped"
    shutil.copytree(resolve_model_path(MODEL), path)
    config = json.loads((path / "config.json").read_text())
    config["text_config"].update(attn_logit_softcapping=1.5, final_logit_softcapping=2.0)
    (path / "config.json").write_text(json.dumps(config))
    prompt, imgs = turn("Describe this picture.", 1), images[:1]
    inputs = AutoProcessor.from_pretrained(path)(text=prompt, images=imgs, return_tensors="pt")
    model = Gemma3ForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.inference_mode():
        want = model.generate(
            **inputs,
            max_new_tokens=MAX_NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    want_ids = want.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    want_lps = [
        float(step[0].log_softmax(-1)[tok]) for step, tok in zip(want.logits, want_ids, strict=True)
    ]
    llm = LLM(str(path), seed=0)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, logprobs=0)
    out = llm.generate([{"prompt": prompt, "images": imgs}], params, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == want_ids
    got_lps = [lp.logprob for lp in out.outputs[0].logprobs]
    torch.testing.assert_close(torch.tensor(got_lps), torch.tensor(want_lps), atol=1e-4, rtol=0)


def test_small_preset_with_tied_embeddings(images):
    """tiny-gemma3-small ties lm_head to the embeddings as released Gemma 3 does (no lm_head
    in the checkpoint) and has 64-token images."""
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    path = resolve_model_path("tiny-gemma3-small")
    prompt, imgs = turn("Describe this picture.", 1), images[:1]
    inputs = AutoProcessor.from_pretrained(path)(text=prompt, images=imgs, return_tensors="pt")
    model = Gemma3ForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.inference_mode():
        want = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    llm = LLM("tiny-gemma3-small", seed=0)
    params = SamplingParams(temperature=0, max_tokens=8)
    out = llm.generate([{"prompt": prompt, "images": imgs}], params, use_tqdm=False)[0]
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == want[0, inputs["input_ids"].shape[1] :].tolist()
