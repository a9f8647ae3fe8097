"""Per-image preprocessing time: the transformers processor vs mmserve's fast paths.

For each model and resolution (``mmserve.bench.lib.images``' deterministic photo-like images):

- ``processor``: the preprocessing call alone on a decoded RGB image: the HF processor
  (``hf``) and ``image.fast`` in its ``exact`` and ``fast`` modes;
- ``admission``: the whole ``ImagePreparer.prepare`` on JPEG bytes (decode + content hash +
  preprocessing), per mode.

Variants run interleaved within each round (order rotated per round); the table gives the median
and [min, max] over rounds in ms, one torch thread. Also prints the largest pixel-value
difference of each mode from the HF processor's.

    echo -20 > /proc/self/autogroup   # as root, optional: shields the run from other load
    python benchmarks/preprocess_timing.py --rounds 15 --out benchmarks/results/preprocess.json
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import PIL
import torch
import transformers

from mmserve.bench.lib.images import synthetic_image
from mmserve.engine.setup.loading import build_model_config, load_image_processor
from mmserve.multimodal.image.prep import IMAGE_INPUTS, ImagePreparer
from mmserve.multimodal.media.policy import MediaFetchPolicy

MODES = ("hf", "exact", "fast")


def jpeg(seed: int, resolution: str) -> bytes:
    buf = io.BytesIO()
    synthetic_image(seed, resolution).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def time_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def arrays(data) -> list[np.ndarray]:
    return [np.asarray(v) for v in data.values()] if isinstance(data, dict) else [data]


def measure(model: str, resolution: str, rounds: int, images: int) -> dict:
    config = build_model_config(model)
    processor = load_image_processor(config.path, config.processor_kwargs)
    preparers = {m: ImagePreparer(config, processor, MediaFetchPolicy(), m) for m in MODES}
    hf = IMAGE_INPUTS[config.architecture].hf
    raws = [jpeg(seed, resolution) for seed in range(images)]
    decoded = [preparers["hf"].prepare(raw) for raw in raws]  # warm-up + reference
    pil = [synthetic_image(seed, resolution) for seed in range(images)]  # decoded-like RGB
    variants = {}
    for mode in MODES:
        call = (lambda im: hf(processor, im)) if mode == "hf" else preparers[mode].fast
        variants[f"processor/{mode}"] = lambda call=call: [call(im) for im in pil]
        prep = preparers[mode]
        variants[f"admission/{mode}"] = lambda prep=prep: [prep.prepare(raw) for raw in raws]
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(time_ms(variants[name]) / images)
    max_diff = {}
    for mode in ("exact", "fast"):
        got = [preparers[mode].prepare(raw) for raw in raws]
        max_diff[mode] = max(
            float(np.abs(a - b).max()) if a.dtype == np.float32 else float(np.any(a != b))
            for g, w in zip(got, decoded, strict=True)
            for a, b in zip(arrays(g.data), arrays(w.data), strict=True)
        )
        assert all(g.mm_hash == w.mm_hash for g, w in zip(got, decoded, strict=True))
    return {
        "model": model,
        "resolution": resolution,
        "ms_per_image": {
            name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for name, v in samples.items()
        },
        "max_abs_diff_vs_hf": max_diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny-llava-small,tiny-qwen2-vl-small")
    parser.add_argument("--resolutions", default="720p,1080p")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--images", type=int, default=4, help="distinct images per round")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [
        measure(model, res, args.rounds, args.images)
        for model in args.models.split(",")
        for res in args.resolutions.split(",")
    ]
    print("| model | image | step | hf ms | exact ms (x) | fast ms (x) | max diff exact / fast |")
    print("|---|---|---|---|---|---|---|")
    for res in results:
        ms = res["ms_per_image"]
        for step in ("processor", "admission"):
            base = ms[f"{step}/hf"]["median"]
            cells = [f"{base:.2f} [{ms[f'{step}/hf']['min']:.2f}, {ms[f'{step}/hf']['max']:.2f}]"]
            for mode in ("exact", "fast"):
                m = ms[f"{step}/{mode}"]
                spread = f"[{m['min']:.2f}, {m['max']:.2f}]"
                cells.append(f"{m['median']:.2f} {spread} ({base / m['median']:.1f}x)")
            diff = res["max_abs_diff_vs_hf"]
            print(
                f"| {res['model']} | {res['resolution']} | {step} | {' | '.join(cells)}"
                f" | {diff['exact']:.2g} / {diff['fast']:.3g} |"
            )
    if args.out:
        meta = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "pillow": PIL.__version__,
            "numpy": np.__version__,
            "rounds": args.rounds,
            "images_per_round": args.images,
            "torch_threads": 1,
        }
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
