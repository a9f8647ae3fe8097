"""``mmserve bench real`` (issue 30 d4): every engine run in a fresh process, each figure
recorded and put beside the machine's limits, and vLLM handed the very workload mmserve gets.
Run on a tiny preset here (the real shapes take minutes per request on CI's CPUs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from mmserve.bench.cli import main as bench_main
from mmserve.bench.gpu.measure import FOLLOWUP_SEED, TTFT_RUN, TURNS_SEED
from mmserve.bench.lib.engines.runners import TurnResult
from mmserve.bench.lib.engines.vllm_baseline import ImageDir
from mmserve.bench.lib.images import png_bytes
from mmserve.bench.lib.workloads import Spec
from mmserve.bench.multiturn.conversation import history_answer, run_conversation
from mmserve.bench.real.plan import build_parser, profile_of
from mmserve.bench.real.run import vllm_payload
from mmserve.bench.real.tables import render
from mmserve.bench.reuse.workload import Workload
from mmserve.models.tiny import resolve_model_path

TINY = ["--resolution", "160x120", "--reuse-requests", "3", "--decode-tokens", "4"]
TINY += ["--decode-batches", "1,3", "--turns", "2", "--answer-tokens", "3", "--ttft-repeats", "1"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("real")
    argv = ["real", "--models", "tiny-llava", "--engines", "mmserve,transformers"]
    argv += [*TINY, "--rounds", "2", "--out", str(out), "--no-raise-priority"]
    assert bench_main(argv) == 0
    results: dict[str, Any] = json.loads((out / "real.json").read_text())
    assert (out / "real.md").read_text() == results["markdown"]
    return results


def test_each_engine_ran_every_round_in_its_own_process(tiny_run: dict[str, Any]) -> None:
    runs = tiny_run["models"]["tiny-llava"]["runs"]
    assert [len(runs[e]) for e in ("mmserve", "transformers")] == [2, 2]
    for engine_runs in runs.values():
        for run in engine_runs:
            assert "error" not in run, run
            # load counts from the process's start, so imports are in it
            assert 0 < run["load_s"] <= run["seconds"]
            assert run["peak_rss"] > 100 << 20
    mmserve = runs["mmserve"][0]
    for key in ("ttft_s", "decode_b1_tok_s", "decode_b3_tok_s", "reuse_0_req_s", "reuse_30_req_s"):
        assert mmserve[key] > 0, key
    assert len(mmserve["multiturn_ttft_s"]) == 2
    # the chat about one image: its image is encoded on turn 1 only, and turn 2 reads turn 1's
    # tokens from the prefix cache
    assert mmserve["followup_images_encoded"] == [1, 0]
    assert mmserve["followup_cached_tokens"][1] > 0
    assert len(runs["transformers"][0]["followup_ttft_s"]) == 2
    # the same history for each engine (fixed answers), so the same prompts to prefill
    for prefix in ("multiturn", "followup"):
        prompts = {e: runs[e][0][f"{prefix}_prompt_tokens"] for e in ("mmserve", "transformers")}
        assert prompts["mmserve"] == prompts["transformers"] and prompts["mmserve"][1] > 0
    assert mmserve["reuse_0_images_encoded"] == 3
    assert "reuse_0_req_s" not in runs["transformers"][0]  # one by one: only on request
    assert mmserve["cuda_graphs"]["mode"] == "off"  # the CPU default: eager decode


def test_limits_and_prefill_flops_are_measured(tiny_run: dict[str, Any]) -> None:
    limits = tiny_run["limits"]
    assert limits["read_gb_s"] > 0.1 and limits["matmul_gflop_s"] > 0.1
    after = tiny_run["limits_after"]  # measured again once the engines ran
    assert after["read_gb_s"] > 0.1 and after["matmul_gflop_s"] > 0.1
    assert f"{after['read_gb_s']:.3g} GB/s and" in tiny_run["markdown"]  # in the limits line
    assert limits["matmul_dtype"] == tiny_run["profile"]["bench_dtype"]
    flops = tiny_run["models"]["tiny-llava"]["flops"]
    assert flops["flops_per_request"] > 0
    assert (
        flops["prompt_tokens"]
        == tiny_run["models"]["tiny-llava"]["runs"]["mmserve"][0]["prompt_tokens_one_image"]
    )


def test_table_rows_show_medians_ranges_and_limits(tiny_run: dict[str, Any]) -> None:
    table = tiny_run["markdown"]
    assert "| metric | mmserve | transformers | mmserve vs vLLM-cpu | limit |" in table
    ttft = [v["ttft_s"] for v in tiny_run["models"]["tiny-llava"]["runs"]["mmserve"]]
    row = next(line for line in table.splitlines() if line.startswith("| TTFT"))
    assert f"({min(ttft):.3g}-{max(ttft):.3g})" in row
    assert "read bandwidth" in table and "chat TTFT, turn 2" in table
    assert "chat about one image, TTFT turn 2" in table


def record(engine_runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    profile = profile_of(build_parser().parse_args(TINY), "bfloat16")
    return {
        "run": {"threads": 2},
        "profile": profile.as_json(),
        "engines": list(engine_runs),
        "limits": {
            "read_gb_s": 20.0,
            "matmul_gflop_s": 100.0,
            "matmul_dtype": "bfloat16",
            "matmul_size": 2048,
            "cpu_capability": "AVX512",
        },  # fmt: skip
        "models": {
            "m": {
                "params": 3 * 10**9,
                "lm_params": 10**9,
                "runs": engine_runs,
                "flops": {"flops_per_request": 10**12, "prompt_tokens": 300},
            },  # fmt: skip
        },
    }


def test_ratio_to_vllm_and_share_of_limit_follow_the_medians() -> None:
    results = record(
        {
            "mmserve": [{"ttft_s": 20.0, "decode_b1_tok_s": 5.0}, {"ttft_s": 30.0}],
            "vllm": [{"ttft_s": 25.0, "decode_b1_tok_s": 4.0}, {"error": "boom\nOSError: x"}],
        }
    )
    rows = {line.split(" | ")[0]: line for line in render(results).splitlines()}
    # TTFT: median 25 s for both (vLLM's failed run left out); limit 1e12 / 1e11 = 10 s
    assert rows["| TTFT, one new image, s"] == (
        "| TTFT, one new image, s | 25 (20-30) | 25 | 1x | 10 | 40 |"
    )
    # batch 1 reads 2 GB of bfloat16 weights per token: 20 GB/s / 2 GB = 10 tok/s
    assert rows["| decode tok/s, batch 1"] == "| decode tok/s, batch 1 | 5 | 4 | 1.25x | 10 | 50 |"
    assert "vLLM-cpu: 1 failed run(s): OSError: x" in render(results)


def test_a_chat_vllm_refused_keeps_its_first_turns_and_is_noted() -> None:
    refused = "turn 3: The decoder prompt (length 11162) is longer than the maximum model length"
    results = record(
        {
            "mmserve": [{"multiturn_ttft_s": [5.0, 6.0, 7.0]}],
            "vllm": [{"multiturn_ttft_s": [4.0, 8.0], "multiturn_refused": refused}],
        }
    )
    table = render(results)
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    assert rows["| chat TTFT, turn 2, s"].startswith("| chat TTFT, turn 2, s | 6 | 8 | 1.33x")
    assert rows["| chat TTFT, turn 3, s"].startswith("| chat TTFT, turn 3, s | 7 | – | –x")
    assert f"vLLM-cpu refused the chat with a new image each turn in 1 run(s): {refused}" in table


def test_decode_limit_counts_the_bytes_the_checkpoint_stores() -> None:
    """A bfloat16 checkpoint run in float32 can be read as its bfloat16 bytes: its decode limit
    is the bandwidth over those, not over the float32 bytes."""
    results = record({"mmserve": [{"decode_b1_tok_s": 5.0}]})
    results["profile"]["bench_dtype"] = "float32"
    entry = results["models"]["m"]
    rows = {line.split(" | ")[0]: line for line in render(results).splitlines()}
    assert rows["| decode tok/s, batch 1"].endswith("| 5 | 100 |")  # 20 GB/s / 4 GB
    entry["lm_bytes"] = 2 * entry["lm_params"]
    rows = {line.split(" | ")[0]: line for line in render(results).splitlines()}
    assert rows["| decode tok/s, batch 1"].endswith("| 10 | 50 |")  # 20 GB/s / 2 GB


def test_limits_use_the_faster_of_before_and_after_the_engines() -> None:
    results = record({"mmserve": [{"decode_b1_tok_s": 5.0, "ttft_s": 20.0}]})
    results["limits_after"] = {**results["limits"], "read_gb_s": 40.0, "matmul_gflop_s": 50.0}
    table = render(results)
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    # decode: 40 GB/s (after) / 2 GB = 20 tok/s; TTFT: 1e12 FLOP / 100 GFLOP/s (before) = 10 s
    assert rows["| decode tok/s, batch 1"].endswith("| 20 | 25 |")
    assert rows["| TTFT, one new image, s"].endswith("| 10 | 50 |")
    assert "20 GB/s and 100 GFLOP/s before" in table and "40 GB/s and 50 GFLOP/s after" in table


def test_limits_measured_only_after_the_engines_still_render() -> None:
    results = record({"mmserve": [{"decode_b1_tok_s": 5.0}]})
    results["limits_after"] = results["limits"]
    results["limits"] = {"error": "the limits child failed"}
    table = render(results)
    assert "20 GB/s and 100 GFLOP/s after the engines" in table and "before" not in table


def test_parameter_counts_read_the_stored_bytes() -> None:
    from mmserve.bench.gpu.engines import parameter_counts

    counts = parameter_counts("tiny-llava")
    files = resolve_model_path("tiny-llava").glob("*.safetensors")
    tensors = {k: v for f in files for k, v in load_file(f).items()}
    language = [v for k, v in tensors.items() if "vision" not in k and "visual" not in k]
    assert counts["lm_params"] == sum(v.numel() for v in language)
    assert counts["lm_bytes"] == sum(v.numel() * v.element_size() for v in language)


def test_vllm_gets_the_prompts_and_images_mmserve_gets(tmp_path: Path) -> None:
    profile = profile_of(build_parser().parse_args(["--models", "tiny-llava", *TINY]), "float32")
    payload = vllm_payload(profile, "tiny-llava", ImageDir(tmp_path, profile.resolution))
    work = Workload("tiny-llava", profile.resolution)
    assert payload["ttft"] == [
        {"prompt": work.prompt(Spec(0, 0, 0, TTFT_RUN)), "image": payload["ttft"][0]["image"]}
    ]
    image = Path(payload["ttft"][0]["image"]).read_bytes()
    assert image == png_bytes(Spec(0, 0, 0, TTFT_RUN).image_seed, (160, 120))
    assert Path(payload["conversation"][1]["image"]).read_bytes() == png_bytes(
        TURNS_SEED + 1, (160, 120)
    )
    followup = payload["followup"]
    assert Path(followup[0]["image"]).read_bytes() == png_bytes(FOLLOWUP_SEED, (160, 120))
    assert [turn["image"] for turn in followup[1:]] == [None]
    assert sorted(payload["reuse"]) == ["0", "30"] and len(payload["reuse"]["30"]) == 3
    assert payload["dtype"] == "float32" and payload["decode_batches"] == [1, 3]
    # the history's answers are the fixed ones run_conversation gives every other engine
    for chat in (payload["conversation"], followup):
        assert [turn["answer"] for turn in chat] == [history_answer(t) for t in range(2)]


def test_every_engine_is_sent_the_same_history_whatever_it_answered() -> None:
    """Random weights answer differently per engine and dtype, and an answer's text can
    re-tokenize into many more tokens than were generated (a shape preset's filler tokens):
    the history carries fixed answers, so every engine prefills the same prompts."""
    sent: list[list[dict[str, Any]]] = []

    class Runner:
        name = "fake"

        def chat_turn(self, messages: list[dict[str, Any]], answer_tokens: int) -> TurnResult:
            sent.append([dict(m) for m in messages])
            answer = f"<unused{len(sent)}>" * 16
            return TurnResult(0.1, 0.0, 0, 10, 0, answer, [7] * 16)

    for new_images in (True, False):
        sent.clear()
        rows = run_conversation(Runner(), 3, (32, 24), 16, 5, new_images)
        assert [r["answer"] for r in rows] == [f"<unused{n}>" * 16 for n in (1, 2, 3)]
        assistant = [m["content"] for m in sent[-1] if m["role"] == "assistant"]
        assert assistant == [history_answer(0), history_answer(1)]


@pytest.mark.parametrize(
    "flag",
    [
        ["--resolution", "0x5"],
        ["--decode-batches", "1,x"],
        ["--reuse", "100"],
        ["--rounds", "0"],
        ["--decode-tokens", "1"],
        ["--ttft-repeats", "x"],
    ],
)
def test_bad_options_are_one_line_errors(flag: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(flag)
    assert exit_.value.code == 2
    assert flag[0] in capsys.readouterr().err


def test_smolvlm_images_are_capped_at_two_tiles_a_side_for_every_engine(tmp_path: Path) -> None:
    """SmolVLM's processor resizes every image to a 4-tile longest edge (2,048 pixels: a
    448x448 image is 17 tiles); the benches cap it at 2 tiles a side (1,024: 5 tiles) for
    every engine alike, as vLLM's examples pass ``size`` in ``mm_processor_kwargs``."""
    from mmserve import LLM, SamplingParams
    from mmserve.bench.lib.engines.runners import processor_kwargs_for
    from tests.support.images import make_image

    cap = {"size": {"longest_edge": 128}}  # tiny-smolvlm: 64-pixel tiles, 192-pixel images
    assert processor_kwargs_for("tiny-smolvlm", None) == cap
    assert processor_kwargs_for("tiny-llava", None) == {}
    argv = ["--models", "tiny-smolvlm", *TINY]
    profile = profile_of(build_parser().parse_args(argv), "float32")
    payload = vllm_payload(profile, "tiny-smolvlm", ImageDir(tmp_path, profile.resolution))
    assert payload["engine_args"]["mm_processor_kwargs"] == cap
    prompt = "<|im_start|>User:<image>What?<end_of_utterance>\nAssistant:"
    image_tokens = []
    for kwargs in (None, cap):
        llm = LLM("tiny-smolvlm", mm_processor_kwargs=kwargs)
        inputs = {"prompt": prompt, "multi_modal_data": {"image": make_image(3, (160, 120))}}
        [out] = llm.generate(inputs, SamplingParams(max_tokens=1))
        image_id = llm.engine.tokenizer.convert_tokens_to_ids("<image>")
        image_tokens.append(out.prompt_token_ids.count(image_id))
    assert image_tokens == [(3 * 3 + 1) * 16, (2 * 2 + 1) * 16]  # 16 embeddings a tile
