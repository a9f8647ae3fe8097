"""Loading at scale: peak RSS from engine start to ready stays within
weight bytes + KV cache bytes + 1 GiB (issue 29).

The checkpoint is Qwen2-VL-2B's published shape (bf16, tied embeddings, 151936-token
vocabulary, two shards) cut to 6 text and 6 vision layers: ~0.6 B parameters, ~1.2 GB. The
engine starts in a fresh interpreter; its peak RSS (``ru_maxrss``, which counts file pages
mapped into the process too) is compared with the RSS after importing torch and mmserve.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmserve.models.tiny.shapes import build_spec, get_shape
from mmserve.models.tiny.shapes.spec import GB

GIB = 1 << 30
KV_BYTES = 128 << 20

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from mmserve import LLM, SamplingParams
    from mmserve.engine.loop import llm_engine  # everything the engine imports, before the baseline
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    llm = LLM(model=sys.argv[1], dtype="bfloat16", kv_cache_memory=int(sys.argv[2]),
              max_model_len=2048)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    chat = [{"role": "user", "content": "Hello"}]
    out = llm.chat(chat, SamplingParams(max_tokens=3, temperature=0))
    print(json.dumps({"base": base, "peak": peak, "tokens": len(out[0].outputs[0].token_ids)}))
    """
)


@pytest.fixture(scope="module")
def qwen2_vl_cut(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = get_shape("shape:Qwen2-VL-2B-Instruct").resized(
        {"num_hidden_layers": 6, "vision_config": {"depth": 6}}, max_shard_bytes=GB
    )
    return build_spec(spec, tmp_path_factory.mktemp("shape") / "qwen2-vl-cut")


def test_start_to_ready_peak_rss_within_weights_kv_and_1gib(qwen2_vl_cut: Path) -> None:
    weight_bytes = sum(f.stat().st_size for f in qwen2_vl_cut.glob("*.safetensors"))
    assert len(list(qwen2_vl_cut.glob("*.safetensors"))) == 2 and weight_bytes > GIB
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(qwen2_vl_cut), str(KV_BYTES)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    used = result["peak"] - result["base"]
    bound = weight_bytes + KV_BYTES + GIB
    print(f"peak RSS above imports {used / GIB:.2f} GiB, bound {bound / GIB:.2f} GiB")
    assert used <= bound, f"{used / GIB:.2f} GiB > {bound / GIB:.2f} GiB"
    assert result["tokens"] == 3
