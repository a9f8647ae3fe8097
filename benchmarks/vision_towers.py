"""Vision-tower time per image: mmserve's towers vs transformers' modules, interleaved.

    python benchmarks/vision_towers.py [--images 1] [--rounds 15] [--threads 2] [--clock wall]

Loads each preset once as mmserve runs it and once as transformers' model (the towers mmserve
used before it had its own: ``CLIPVisionModel`` with ``output_hidden_states=True`` and
``Qwen2VisionTransformerPretrainedModel``), encodes the same 1280x720 images with both in
alternating rounds in one process (so both see the same machine load), and prints the median
and spread of milliseconds per image, the median of the per-round speed-ups (robust to load
that changes between rounds) and the largest embedding difference. Raises its own
scheduling priority when it can (``/proc/self/autogroup``, root only). On a machine shared
with other work, ``--threads 1 --clock cpu`` measures the process's CPU time instead of wall
time: the work itself, unaffected by waiting for a core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.engine.setup.loading import build_model_config, load_image_processor, load_model
from mmserve.multimodal.image.prep import IMAGE_INPUTS


def transformers_encoder(name: str, path: Any) -> Callable[[list[Any]], list[torch.Tensor]]:
    """The image -> embeddings path as transformers runs it."""
    import transformers

    if name.startswith("tiny-qwen2-vl"):
        qwen = transformers.Qwen2VLForConditionalGeneration.from_pretrained(path).eval()

        def encode_qwen(items: list[Any]) -> list[torch.Tensor]:
            pixels = torch.cat([torch.as_tensor(d["pixel_values"]) for d in items])
            grid = torch.tensor([d["image_grid_thw"] for d in items])
            out = qwen.model.visual(pixels, grid_thw=grid).pooler_output
            return list(out.split((grid.prod(-1) // 4).tolist()))

        return encode_qwen
    llava = transformers.LlavaForConditionalGeneration.from_pretrained(path).eval()
    layer = llava.config.vision_feature_layer

    def encode_llava(items: list[Any]) -> list[torch.Tensor]:
        batch = torch.stack([torch.as_tensor(p) for p in items])
        hidden = llava.model.vision_tower(batch, output_hidden_states=True).hidden_states[layer]
        return list(llava.model.multi_modal_projector(hidden[:, 1:]))

    return encode_llava


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-llava-small,tiny-qwen2-vl-small")
    parser.add_argument("--images", type=int, default=1, help="images per encode call")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    add_priority_arg(parser)
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    apply_priority(args)
    rng = np.random.default_rng(0)
    for name in args.models.split(","):
        cfg = build_model_config(name)
        proc = load_image_processor(cfg.path, {})
        prepare = IMAGE_INPUTS[cfg.architecture]
        images = [rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8) for _ in range(args.images)]
        items = [prepare(proc, Image.fromarray(im), cfg)[0] for im in images]
        encoders = {
            "transformers": transformers_encoder(name, cfg.path),
            "mmserve": load_model(cfg, torch.device("cpu")).encode_images,
        }
        times: dict[str, list[float]] = {key: [] for key in encoders}
        outputs = {}
        with torch.inference_mode():
            for key, encode in encoders.items():
                outputs[key] = encode(items)  # warm-up
            for _ in range(args.rounds):
                for key, encode in encoders.items():
                    start = clock()
                    encode(items)
                    times[key].append((clock() - start) * 1e3 / len(items))
        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(outputs["mmserve"], outputs["transformers"], strict=True)
        )
        scale = max(b.abs().max().item() for b in outputs["transformers"])
        print(
            f"{name}, {len(items)} image(s) of 1280x720 per call, {args.threads} thread(s),"
            f" {args.clock} clock:"
        )
        for key, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            print(
                f"  {key:>12}: median {statistics.median(ts):8.2f} ms/image"
                f"  (IQR {q[0]:.2f}-{q[2]:.2f}, min {min(ts):.2f}, {len(ts)} rounds)"
            )
        ratios = [a / b for a, b in zip(times["transformers"], times["mmserve"], strict=True)]
        print(f"  speed-up, median of the per-round ratios: {statistics.median(ratios):.2f}x")
        print(f"  max |mmserve - transformers| = {diff:.3g} (largest |value| {scale:.3g})")


if __name__ == "__main__":
    main()
