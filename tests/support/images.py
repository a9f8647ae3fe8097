"""Deterministic test images."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw


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
