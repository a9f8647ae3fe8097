"""The Llama decoder's MLP uses the checkpoint's ``hidden_act``: a supported non-silu one
matches transformers, an unsupported one fails loading with a ValueError naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from mmserve import LLM, SamplingParams
from mmserve.engine.setup.loading import build_model_config, load_model
from mmserve.models.tiny import resolve_model_path

MAX_NEW = 16
PROMPT = "USER: Tell me a story about a red cube. ASSISTANT:"


def with_text_activation(tmp_path: Path, activation: str) -> Path:
    """A copy of tiny-llava whose text config's ``hidden_act`` is ``activation``."""
    out = tmp_path / f"tiny-llava-{activation}"
    shutil.copytree(resolve_model_path("tiny-llava"), out)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["text_config"]["hidden_act"] = activation
    config_path.write_text(json.dumps(config))
    return out


def test_non_silu_activation_matches_transformers(tmp_path: Path) -> None:
    path = with_text_activation(tmp_path, "gelu_pytorch_tanh")
    processor = AutoProcessor.from_pretrained(path)
    hf = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    inputs = processor(text=PROMPT, return_tensors="pt")
    with torch.inference_mode():
        out = hf.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    expected = out[0, inputs["input_ids"].shape[1] :].tolist()
    llm = LLM(str(path), seed=0)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW)
    got = llm.generate([{"prompt": PROMPT}], params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == expected


def test_unsupported_activation_fails_loading(tmp_path: Path) -> None:
    config = build_model_config(str(with_text_activation(tmp_path, "relu2")))
    with pytest.raises(ValueError, match="'relu2'"):
        load_model(config, torch.device("cpu"))
