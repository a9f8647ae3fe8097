"""The parity stage: greedy mmserve against transformers on the same device, two image
requests and a text-only one. float32 (TF32 off) must be token-identical; bfloat16 must be
close by vLLM's rule (``bench.lib.closeness``). The same engine then decodes the requests
again without its decode graphs: graphs against eager, on the device itself. Mismatches are
results, not exceptions: the stage reports them and the run goes on."""

from __future__ import annotations

from typing import Any

import torch

from mmserve import SamplingParams
from mmserve.bench.gpu.engines import (
    eager_decode,
    graph_record,
    image_requests,
    mmserve_engine,
    reference,
    release,
    text_prompt,
    workload,
)
from mmserve.bench.gpu.plan import Profile
from mmserve.bench.lib.closeness import compare_samples, mmserve_sample, transformers_sample

TOP = 5
PARITY_RUN = 11  # image seeds of their own


def _samples_per_engine(
    profile: Profile, model: str, dtype: str, requests: list[dict[str, Any]]
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """mmserve's samples, transformers', and the graphs against eager (``graphs``)."""
    params = SamplingParams(
        temperature=0, max_tokens=profile.parity_tokens, logprobs=TOP, ignore_eos=True
    )
    llm = mmserve_engine(profile, model, dtype)
    ours = [mmserve_sample(o) for o in llm.generate(requests, params, use_tqdm=False)]
    graphs = graph_record(llm)
    with eager_decode(llm) as had_graphs:
        if had_graphs:
            eager = [mmserve_sample(o) for o in llm.generate(requests, params, use_tqdm=False)]
            verdicts = [compare_samples(g, e) for g, e in zip(ours, eager, strict=True)]
            graphs["identical_to_eager"] = all(v.identical for v in verdicts)
            graphs["close_to_eager"] = all(v.close for v in verdicts)
    del llm
    release(profile.device)
    ref = reference(profile, model, dtype)
    theirs = []
    for request in requests:
        inputs = ref.inputs(request["prompt"], request["images"])
        inputs = {k: v.to(ref.device) for k, v in inputs.items()}
        theirs.append(transformers_sample(ref.model, inputs, profile.parity_tokens, TOP))
    del ref
    release(profile.device)
    return ours, theirs, graphs


def parity(profile: Profile, model: str) -> dict[str, Any]:
    """Per dtype: ``identical`` / ``close`` over all requests, each request's equal prefix and
    the first mismatch's detail, ``graphs`` (``graph_record`` and the graphs against eager);
    ``passed``: float32 identical and bfloat16 close."""
    work = workload(profile, model)
    requests = image_requests(work, 2, PARITY_RUN)
    requests.append({"prompt": text_prompt(work), "images": []})
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    out: dict[str, Any] = {"requests": len(requests), "tokens": profile.parity_tokens}
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        for dtype in ("float32", "bfloat16"):
            ours, theirs, graphs = _samples_per_engine(profile, model, dtype, requests)
            verdicts = [compare_samples(o, t) for o, t in zip(ours, theirs, strict=True)]
            out[dtype] = {
                "identical": all(v.identical for v in verdicts),
                "close": all(v.close for v in verdicts),
                "equal_prefix": [v.equal_prefix for v in verdicts],
                "details": [v.detail for v in verdicts if v.detail],
                "graphs": graphs,
            }
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    out["passed"] = out["float32"]["identical"] and out["bfloat16"]["close"]
    return out
