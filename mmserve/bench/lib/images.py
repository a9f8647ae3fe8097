"""Deterministic photo-like benchmark images: gradients + shapes + text at a given resolution."""

from __future__ import annotations

import base64
import functools
import io

import numpy as np
from PIL import Image, ImageDraw

RESOLUTIONS = {
    "480p": (854, 480),
    "720p": (1280, 720),
    "1080p": (1920, 1080),
    "1440p": (2560, 1440),
}


def synthetic_image(seed: int, resolution: str | tuple[int, int] = "720p") -> Image.Image:
    """A deterministic RGB image, different per seed, at a named or (width, height) size."""
    width, height = RESOLUTIONS[resolution] if isinstance(resolution, str) else resolution
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    base = rng.uniform(0, 255, 3) * x + rng.uniform(0, 255, 3) * (1 - y)
    noise = rng.normal(0, 6, (height, width, 1)).astype(np.float32)
    image = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(8):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        size = int(rng.integers(height // 12, height // 3))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([x0, y0, x0 + size, y0 + size], fill=color)
    draw.text((width // 20, height - height // 10), f"image #{seed}", fill=(255, 255, 255))
    return image


@functools.lru_cache(maxsize=64)
def png_bytes(seed: int, resolution: str | tuple[int, int] = "720p") -> bytes:
    """``synthetic_image`` encoded as PNG (what a client sends); memoized per process."""
    buf = io.BytesIO()
    synthetic_image(seed, resolution).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def png_data_url(seed: int, resolution: str | tuple[int, int] = "720p") -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed, resolution)).decode()
