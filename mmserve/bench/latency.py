"""Single-request latency: one image + question, greedy, mmserve vs transformers generate."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mmserve import LLM, SamplingParams
from mmserve.bench.images import synthetic_image
from mmserve.bench.report import markdown_table, save
from mmserve.bench.runners import TransformersRunner


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="mmserve bench latency", description=__doc__)
    parser.add_argument("--model", default="tiny-llava-small")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    # a new image every repetition: nothing is served from a cache
    images = [synthetic_image(100 + i, "720p") for i in range(args.repeats + 1)]
    prompt = "USER: <image>\nWhat is in this image? ASSISTANT:"
    llm = LLM(args.model)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    ref = TransformersRunner(args.model)
    timings: dict[str, list[float]] = {"mmserve": [], "transformers": []}
    for i, image in enumerate(images):
        start = time.perf_counter()
        llm.generate({"prompt": prompt, "images": [image]}, params, use_tqdm=False)
        mm = time.perf_counter() - start
        start = time.perf_counter()
        inputs = ref.processor(text=prompt, images=[image], return_tensors="pt")
        with torch.inference_mode():
            ref.model.generate(**inputs, max_new_tokens=args.max_tokens,
                               min_new_tokens=args.max_tokens, do_sample=False)
        hf = time.perf_counter() - start
        if i:  # the first round is warm-up
            timings["mmserve"].append(mm)
            timings["transformers"].append(hf)
    base = statistics.median(timings["mmserve"])
    rows = [{"engine": k, "median_s": statistics.median(v), "min_s": min(v),
             "ratio": statistics.median(v) / base} for k, v in timings.items()]
    print(markdown_table(rows, ["engine", "median_s", "min_s", "ratio"]))
    path = save("latency", args.out, {"args": vars(args), "rows": rows, "timings": timings})
    print(f"results: {path}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
