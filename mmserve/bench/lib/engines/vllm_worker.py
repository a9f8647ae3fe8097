"""vLLM baseline worker, run by the vLLM virtualenv's python (it never imports mmserve).

``python vllm_worker.py IN.json OUT.json``. IN holds the model path, engine args and either
conversations (``kind: multiturn``) or requests (``kind: requests``) whose images are PNG paths;
OUT gets per-turn / per-request timings and token ids. vLLM runs in-process, eager, float32, with
the environment (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``OMP_NUM_THREADS``) set by the caller.
``python vllm_worker.py --checkpoint SRC OUT_DIR`` prints a directory vLLM can load (for the
OpenAI server of ``bench serve --launch``).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from meter import Meter  # bench/lib/engines/meter.py: this script's directory is on sys.path


def compatible_checkpoint(path: str, tmp: Path) -> str:
    """transformers 5 saves a LLaVA CLIP tower flat (``vision_tower.embeddings.*``); vLLM loads
    ``vision_tower.vision_model.*``. Write a renamed copy when needed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    weights = Path(path) / "model.safetensors"
    if not weights.exists():
        return path
    with safe_open(str(weights), "pt") as f:
        keys = list(f.keys())
        if not any(k.startswith("vision_tower.embeddings.") for k in keys):
            return path
        tensors = {}
        for key in keys:
            new = key
            if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model"):
                new = "vision_tower.vision_model." + key[len("vision_tower.") :]
            tensors[new] = f.get_tensor(key)
    out = tmp / "checkpoint"
    shutil.copytree(path, out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


def drive(llm: Any, prompts: list[tuple[str, dict]], params: Any) -> tuple[dict, dict]:
    """Add the prompts, step until all finish; returns (first-token times, final outputs)."""
    engine = llm.llm_engine
    for req_id, prompt in prompts:
        engine.add_request(req_id, prompt, params)
    first: dict[str, float] = {}
    done: dict[str, Any] = {}
    while len(done) < len(prompts):
        for out in engine.step():
            if out.request_id not in first and out.outputs and out.outputs[0].token_ids:
                first[out.request_id] = time.monotonic()
            if out.finished:
                done[out.request_id] = out
    return first, done


def refusal_errors() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request it refuses (a prompt over ``max_model_len``): its own
    ``VLLMValidationError`` (not a ``ValueError``) where it has one, ``ValueError`` before."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMValidationError)


def run_conversation(
    llm: Any, turns: list[dict], params: Any, tag: str, refused: list[str] | None = None
) -> list[dict]:
    """One chat, turn by turn. With ``refused`` a turn vLLM refuses (``refusal_errors``: its
    prompt over ``max_model_len``) ends the chat and its message is appended there; the turns
    before it are returned. Without, the error propagates."""
    from PIL import Image

    tokenizer = llm.get_tokenizer()
    conv: list[dict] = []
    images: list[Any] = []
    rows = []
    meter = Meter()
    refusals = refusal_errors()
    for n, turn in enumerate(turns):
        start = time.monotonic()
        content: list[dict] = [{"type": "text", "text": turn["text"]}]
        if turn["image"] is not None:  # None: a text follow-up about the images before
            images.append(Image.open(turn["image"]).convert("RGB"))
            content.insert(0, {"type": "image"})
        conv.append({"role": "user", "content": content})
        text = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        prompt = {"prompt": text, "multi_modal_data": {"image": list(images)}}
        try:
            first, done = drive(llm, [(f"{tag}-{n}", prompt)], params)
        except refusals as exc:
            if refused is None:
                raise
            refused.append(f"turn {n + 1}: {exc}")
            break
        out = done[f"{tag}-{n}"]
        answer = out.outputs[0].text
        # the same answer for every engine, as a text part: templates that loop over parts
        # (Idefics3's, LLaVA-OneVision's) render a plain string as nothing, where mmserve
        # (and vLLM's own chat API) hand them parts
        answer_part = {"type": "text", "text": turn["answer"]}
        conv.append({"role": "assistant", "content": [answer_part]})
        rows.append(
            {
                "turn": n + 1,
                "ttft_s": first[f"{tag}-{n}"] - start,
                "prompt_tokens": len(out.prompt_token_ids),
                "cached_tokens": out.num_cached_tokens or 0,
                "answer": answer,
                "token_ids": list(out.outputs[0].token_ids),
            }
        )
    if rows:
        rows[-1]["meter"] = meter.stop()
    return rows


def run_requests(llm: Any, requests: list[dict], params: Any, arrival: str, tag: str) -> dict:
    """Images are decoded before the clock starts (mmserve is handed decoded PIL images too)."""
    from PIL import Image

    loaded: dict[str, Any] = {}
    for r in requests:
        if r["image"] not in loaded:
            loaded[r["image"]] = Image.open(r["image"]).convert("RGB")
    prompts = [
        {"prompt": r["prompt"], "multi_modal_data": {"image": [loaded[r["image"]]]}}
        for r in requests
    ]
    ids = [f"{tag}-{i}" for i in range(len(requests))]
    meter = Meter()
    t0 = time.monotonic()
    ttfts, outs = [], []
    if arrival == "all":
        first, done = drive(llm, list(zip(ids, prompts, strict=True)), params)
        ttfts = [first[i] - t0 for i in ids]
        outs = [done[i] for i in ids]
    else:
        for i, prompt in zip(ids, prompts, strict=True):
            start = time.monotonic()
            first, done = drive(llm, [(i, prompt)], params)
            ttfts.append(first[i] - start)
            outs.append(done[i])
    wall = time.monotonic() - t0
    return {
        "wall_s": wall,
        "meter": meter.stop(),
        "ttfts": ttfts,
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
        "cached_tokens": sum(o.num_cached_tokens or 0 for o in outs),
    }


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--checkpoint":  # --checkpoint SRC OUT_DIR: print a loadable dir
        out_dir = Path(argv[2])
        out_dir.mkdir(parents=True, exist_ok=True)
        print(compatible_checkpoint(argv[1], out_dir))
        return
    from vllm import LLM, SamplingParams

    cfg = json.loads(Path(argv[0]).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        model = compatible_checkpoint(cfg["model"], Path(tmp))
        start = time.monotonic()
        llm = LLM(
            model=model, enforce_eager=True, dtype="float32", seed=0, **cfg.get("engine_args", {})
        )
        import torch
        import vllm

        result: dict[str, Any] = {
            "engine_start_s": time.monotonic() - start,
            "torch_threads": torch.get_num_threads(),
            "versions": {"vllm": vllm.__version__, "torch": torch.__version__},
        }
        params = SamplingParams(temperature=0, max_tokens=cfg["max_tokens"], ignore_eos=True)
        warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        if cfg["kind"] == "multiturn":
            run_conversation(llm, cfg["warmup"], warm, "warm")
            result["conversations"] = [
                run_conversation(llm, turns, params, f"c{i}")
                for i, turns in enumerate(cfg["conversations"])
            ]
        else:
            run_requests(llm, cfg["warmup"], warm, "all", "warm")
            result["runs"] = [
                run_requests(llm, requests, params, cfg["arrival"], f"r{i}")
                for i, requests in enumerate(cfg["runs"])
            ]
    Path(argv[1]).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
