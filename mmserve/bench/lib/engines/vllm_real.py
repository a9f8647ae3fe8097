"""vLLM's side of ``mmserve bench real``, run by the vLLM virtualenv's python in a fresh process
(it never imports mmserve): the numbers ``mmserve.bench.gpu.measure`` takes of mmserve, taken
the same way of vLLM.

``python vllm_real.py IN.json OUT.json``. IN holds the model path, ``dtype``, vLLM's
``engine_args``, ``started`` (``time.time()`` just before this process was started) and the
workload as ``vllm_worker.py`` takes it (prompt text, image PNG paths): ``text_prompt``,
``warmup`` and ``ttft`` requests, ``decode_batches`` / ``decode_tokens``, one ``conversation``
(a new image per turn), one ``followup`` chat (an image on turn 1 only: ``image`` None after)
and the ``reuse`` runs by percentage. OUT gets ``load_s`` (process start to the first token),
``ttft_s``, ``decode_b{B}_tok_s``, ``multiturn_ttft_s``, ``followup_ttft_s``,
``reuse_{P}_req_s`` and ``peak_rss``; a chat vLLM refused a turn of (over
``max_model_len``) keeps the turns before it and the message as ``{multiturn,followup}_refused``.
vLLM runs in-process and eager, with the environment the caller sets.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from vllm_worker import compatible_checkpoint, drive, run_conversation, run_requests


def decode_rate(llm: Any, prompt: str, batch: int, tokens: int) -> float:
    """Tokens after the first per second after the batch's last first token."""
    from vllm import SamplingParams

    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    drive(llm, [(f"warm-b{batch}-{i}", prompt) for i in range(batch)], warm)
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    first, _ = drive(llm, [(f"b{batch}-{i}", prompt) for i in range(batch)], params)
    end = time.monotonic()
    return batch * (tokens - 1) / max(end - max(first.values()), 1e-9)


def measure(cfg: dict[str, Any], model: str) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype=cfg["dtype"], enforce_eager=True, seed=0, **cfg["engine_args"])
    one = SamplingParams(temperature=0, max_tokens=1)
    drive(llm, [("load", cfg["text_prompt"])], one)
    out: dict[str, Any] = {"load_s": time.time() - cfg["started"]}
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    run_requests(llm, cfg["warmup"], warm, "all", "warm")
    ttft = run_requests(llm, cfg["ttft"], one, "sequential", "ttft")["ttfts"]
    out.update(ttft_s=statistics.median(ttft), ttft_all_s=ttft)
    for batch in cfg["decode_batches"]:
        rate = decode_rate(llm, cfg["text_prompt"], batch, cfg["decode_tokens"])
        out[f"decode_b{batch}_tok_s"] = rate
    answer = SamplingParams(temperature=0, max_tokens=cfg["answer_tokens"], ignore_eos=True)
    for prefix, key in (("multiturn", "conversation"), ("followup", "followup")):
        refused: list[str] = []
        rows = run_conversation(llm, cfg.get(key, []), answer, prefix, refused)
        if refused:  # the turns before it still count; the table notes the refusal
            out[f"{prefix}_refused"] = refused[0]
        out[f"{prefix}_ttft_s"] = [r["ttft_s"] for r in rows]
        out[f"{prefix}_cached_tokens"] = [r["cached_tokens"] for r in rows]
        out[f"{prefix}_prompt_tokens"] = [r["prompt_tokens"] for r in rows]
    for pct, requests in cfg["reuse"].items():
        result = run_requests(llm, requests, answer, "all", f"reuse{pct}")
        out[f"reuse_{pct}_req_s"] = len(requests) / result["wall_s"]
    return out


def main(argv: list[str]) -> None:
    import tempfile

    cfg = json.loads(Path(argv[0]).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(cfg, compatible_checkpoint(cfg["model"], Path(tmp)))
    import torch
    import vllm

    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out.update(
        peak_rss=max(usage, children) * 1024,
        torch_threads=torch.get_num_threads(),
        versions={"vllm": vllm.__version__, "torch": torch.__version__},
    )
    Path(argv[1]).write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
