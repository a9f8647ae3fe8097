"""Shared fixtures: deterministic images, the transformers reference, leak checks."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from mmserve.models.tiny import resolve_model_path


def make_image(seed: int, size: tuple[int, int] = (96, 80)) -> Image.Image:
    """A photo-like test image: gradient + a few shapes, different per seed."""
    rng = np.random.default_rng(seed)
    w, h = size
    x = np.linspace(0, 1, w)[None, :, None]
    y = np.linspace(0, 1, h)[:, None, None]
    base = rng.uniform(0, 255, 3) * x + rng.uniform(0, 255, 3) * y
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        color = tuple(int(c) for c in rng.integers(0, 255, 3))
        draw.ellipse([x0, y0, x0 + w // 3, y0 + h // 3], fill=color)
    return img


class Reference:
    """transformers' LlavaForConditionalGeneration + its own processor: the ground truth."""

    def __init__(self, model_name: str) -> None:
        from transformers import AutoProcessor, LlavaForConditionalGeneration

        path = resolve_model_path(model_name)
        self.device = engine_device()
        self.processor = AutoProcessor.from_pretrained(path)
        self.model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
        self.model.to(self.device).eval()

    def inputs(self, prompt: str, images: list[Image.Image]) -> dict:
        kwargs = {"images": images} if images else {}
        return self.processor(text=prompt, return_tensors="pt", **kwargs).to(self.device)

    def greedy(self, prompt: str, images: list[Image.Image], max_new_tokens: int) -> list[int]:
        inputs = self.inputs(prompt, images)
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="session")
def reference() -> Reference:
    return Reference("tiny-llava")


@pytest.fixture(scope="session")
def images() -> list[Image.Image]:
    return [make_image(i, size) for i, size in enumerate([(96, 80), (64, 64), (120, 50), (70, 90)])]


def assert_no_leaks(llm) -> None:
    metrics = llm.get_metrics()
    assert metrics["kv_blocks_used"] == 0, metrics
    assert metrics["encoder_cache_references"] == 0, metrics
    assert metrics["num_requests_running"] == metrics["num_requests_waiting"] == 0


def engine_device() -> str:
    """The device this run's engines and transformers references use (``--device``)."""
    return os.environ.get("MMSERVE_DEVICE", "cpu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-seeds", type=int, default=24, help="differential fuzz: seeds 0..N-1")
    parser.addoption("--fuzz-first-seed", type=int, default=0, help="differential fuzz: first")
    parser.addoption(
        "--device",
        default="cpu",
        help="device of the engines under test: cpu, cuda or cuda:N (every test is skipped"
        " when CUDA is asked for and absent); parity runs in float32 there too",
    )


def pytest_configure(config: pytest.Config) -> None:
    device = config.getoption("device")
    os.environ["MMSERVE_DEVICE"] = device  # EngineArgs' default, also in server subprocesses
    if device != "cpu":
        os.environ["MMSERVE_DTYPE"] = "float32"  # token-identical parity is a float32 claim
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("device").startswith("cuda") and not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="--device cuda: torch sees no CUDA device here")
        for item in items:
            item.add_marker(skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fuzz_seed" in metafunc.fixturenames:
        first = metafunc.config.getoption("fuzz_first_seed")
        count = metafunc.config.getoption("fuzz_seeds")
        metafunc.parametrize("fuzz_seed", range(first, first + count))
