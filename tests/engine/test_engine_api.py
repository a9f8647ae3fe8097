"""Sampling, stopping, chat, bad input and the offline API's contract."""

from __future__ import annotations

import io

import pytest

from mmserve import LLM, SamplingParams
from tests.support.engine import assert_no_leaks

PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llava")


def _tokens(llm, params, images, prompt=PROMPT):
    out = llm.generate({"prompt": prompt, "images": images}, params, use_tqdm=False)[0]
    return out.outputs[0].token_ids


def test_same_seed_same_output_different_seed_differs(llm, images):
    a = _tokens(llm, SamplingParams(temperature=1.0, seed=7, max_tokens=24), images[:1])
    b = _tokens(llm, SamplingParams(temperature=1.0, seed=7, max_tokens=24), images[:1])
    c = _tokens(llm, SamplingParams(temperature=1.0, seed=8, max_tokens=24), images[:1])
    assert a == b
    assert a != c
    assert_no_leaks(llm)


def test_seeded_sampling_is_independent_of_batch(llm, images):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=3, max_tokens=16)
    alone = _tokens(llm, params, images[:1])
    batch = llm.generate(
        [{"prompt": PROMPT, "images": images[:1]}, "USER: hi ASSISTANT:"],
        [params, SamplingParams(temperature=1.0, max_tokens=20)],
        use_tqdm=False,
    )
    assert batch[0].outputs[0].token_ids == alone


def test_top_k_one_equals_greedy(llm, images):
    greedy = _tokens(llm, SamplingParams(temperature=0, max_tokens=24), images[:1])
    top1 = _tokens(llm, SamplingParams(temperature=1.3, top_k=1, seed=1, max_tokens=24), images[:1])
    assert greedy == top1


def test_tiny_top_p_equals_greedy(llm, images):
    greedy = _tokens(llm, SamplingParams(temperature=0, max_tokens=16), images[:1])
    nucleus_params = SamplingParams(temperature=1.0, top_p=1e-6, seed=2, max_tokens=16)
    nucleus = _tokens(llm, nucleus_params, images[:1])
    assert greedy == nucleus


def test_finish_reasons_and_stops(llm, images):
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = llm.generate({"prompt": PROMPT, "images": images[:1]}, greedy, use_tqdm=False)[0]
    ids = full.outputs[0].token_ids
    assert len(ids) == 20 and full.outputs[0].finish_reason == "length"

    stop_id = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[ids[5]])
    out = llm.generate({"prompt": PROMPT, "images": images[:1]}, stop_id, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ids[: ids.index(ids[5]) + 1]
    assert out.outputs[0].finish_reason == "stop"

    text = full.outputs[0].text
    stop = text.strip()[len(text.strip()) // 2 :][:3]
    assert stop
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop])
    out = llm.generate({"prompt": PROMPT, "images": images[:1]}, params, use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].text == text[: text.find(stop)]
    assert_no_leaks(llm)


def test_chat_matches_generate_with_template(llm, images):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": images[0]},
                {"type": "text", "text": "What is it?"},
            ],
        }
    ]
    chat = llm.chat(messages, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    prompt = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    gen = _tokens(llm, SamplingParams(temperature=0, max_tokens=12), images[:1], prompt)
    assert chat.outputs[0].token_ids == gen


def test_image_inputs_in_every_form(llm, images, tmp_path):
    buf = io.BytesIO()
    images[0].save(buf, format="PNG")
    path = tmp_path / "img.png"
    path.write_bytes(buf.getvalue())
    import base64

    data_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    params = SamplingParams(temperature=0, max_tokens=8)
    results = {
        _tuple(_tokens(llm, params, [src]))
        for src in (images[0], str(path), path, buf.getvalue(), data_url)
    }
    assert len(results) == 1


def _tuple(x):
    return tuple(x)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompt": "USER: <image><image> hi ASSISTANT:", "n_images": 1}, "2 image placeholder"),
        ({"prompt": "USER: hi ASSISTANT:", "n_images": 1}, "0 image placeholder"),
        ({"prompt": "hi " * 5000, "n_images": 0}, "max length"),
        ({"prompt": PROMPT, "images": [b"not an image"]}, "could not decode the image"),
        ({"prompt": PROMPT, "images": ["/no/such/file.png"]}, "could not read local image"),
        ({"prompt": PROMPT, "images": ["ftp://x/y.png"]}, "could not fetch image from ftp://"),
        ({"prompt": PROMPT, "images": ["data:image/png;base64,@@@"]}, "invalid base64"),
        ({"prompt_token_ids": [], "n_images": 0}, "empty"),
        ({"prompt_token_ids": [1, 99999], "n_images": 0}, "out of range"),
    ],
)
def test_bad_inputs_raise_and_engine_survives(llm, images, kwargs, match):
    images_arg = kwargs.get("images", images[: kwargs.get("n_images", 0)])
    with pytest.raises(ValueError, match=match):
        prompt = {k: v for k, v in kwargs.items() if k.startswith("prompt")}
        llm.generate({**prompt, "images": images_arg}, use_tqdm=False)
    assert_no_leaks(llm)
    ok = llm.generate("USER: hi ASSISTANT:", SamplingParams(max_tokens=3), use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) >= 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_unknown_model():
    with pytest.raises(ValueError, match="no-such-model"):
        LLM("no-such-model")


def test_a_kv_cache_smaller_than_max_model_len_is_refused_at_start():
    with pytest.raises(
        ValueError, match=r"max_model_len=2048 is more than the KV cache holds \(8 blocks"
    ):
        LLM("tiny-llava", max_model_len=2048, num_kv_blocks=8)


def test_metrics_keys(llm):
    metrics = llm.get_metrics()
    for key in (
        "kv_blocks_total",
        "kv_blocks_used",
        "num_preemptions",
        "prompt_tokens",
        "generation_tokens",
        "encoder_cache_hits",
        "encoder_seconds",
    ):
        assert key in metrics
    assert metrics["prompt_tokens"] > 0 and metrics["generation_tokens"] > 0
