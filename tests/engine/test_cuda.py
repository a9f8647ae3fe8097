"""On a CUDA device (skipped without one): parity with transformers on the same device, the
memory plan, and device placement. ``pytest --device cuda`` runs the whole suite there too."""

from __future__ import annotations

import pytest
import torch

from mmserve import LLM, SamplingParams
from tests.models.test_qwen2_vl import QwenReference, chat_prompt
from tests.support.engine import assert_no_leaks
from tests.support.references import Reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GREEDY = SamplingParams(temperature=0, max_tokens=16)
LLAVA_PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"


def llava_ref(dtype: torch.dtype) -> Reference:
    ref = Reference("tiny-llava")
    ref.device = "cuda"
    ref.model.to("cuda", dtype)
    return ref


@pytest.mark.parametrize("backend", ["torch", "flex"])
def test_llava_float32_on_cuda_is_token_identical_to_transformers_there(images, backend) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    llm = LLM("tiny-llava", device="cuda", dtype="float32", attention_backend=backend)
    assert llm.engine.kv_cache.keys[0].device.type == "cuda"
    ref = llava_ref(torch.float32)
    cases = [(LLAVA_PROMPT, [im]) for im in images[:3]]
    outs = llm.generate([{"prompt": p, "images": ims} for p, ims in cases], GREEDY)
    for (prompt, ims), out in zip(cases, outs, strict=True):
        assert out.outputs[0].token_ids == ref.greedy(prompt, ims, 16)
    assert_no_leaks(llm)


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl"])
def test_qwen_float32_on_cuda_is_token_identical_to_transformers_there(model, images) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    llm = LLM(model, device="cuda", dtype="float32", max_num_batched_tokens=64)
    ref = QwenReference(model)
    ref.device = "cuda"
    ref.model.to("cuda")
    cases = [(chat_prompt(1), [images[0]]), (chat_prompt(2), images[1:3])]
    outs = llm.generate([{"prompt": p, "images": ims} for p, ims in cases], GREEDY)
    for (prompt, ims), out in zip(cases, outs, strict=True):
        assert out.outputs[0].token_ids == ref.greedy(prompt, ims, 16)
    assert_no_leaks(llm)


def test_bfloat16_auto_on_cuda_agrees_with_transformers_on_the_first_tokens(images) -> None:
    # dtype given: under --device cuda the suite's default (MMSERVE_DTYPE) is float32
    llm = LLM("tiny-llava", device="cuda", dtype="auto")  # auto: bfloat16 on CUDA
    assert llm.engine.config.model.dtype == "bfloat16"
    ref = llava_ref(torch.bfloat16)
    out = llm.generate({"prompt": LLAVA_PROMPT, "images": [images[0]]}, GREEDY)[0]
    assert out.outputs[0].token_ids[:2] == ref.greedy(LLAVA_PROMPT, [images[0]], 2)


def test_the_kv_cache_is_sized_from_device_memory_after_profiling(caplog) -> None:
    caplog.set_level("INFO")
    llm = LLM("tiny-llava", device="cuda", gpu_memory_utilization=0.5, max_num_seqs=8)
    mc, cc = llm.engine.config.model, llm.engine.config.cache
    wanted = 8 * -(-mc.max_model_len // cc.block_size)
    assert llm.get_metrics()["kv_blocks_total"] == wanted  # a tiny model: the cap binds
    assert any("device memory:" in r.getMessage() for r in caplog.records)
