"""``RequestIntake.process_all``: the offline API prepares a batch's prompts on several threads
(the model is idle meanwhile, so one thread left the other cores idle), in the prompts' order,
and a prompt naming a media handle still sees every image registered before it."""

from __future__ import annotations

import base64
import io
import threading
import time
from typing import Any

import pytest

from mmserve import LLM, SamplingParams
from mmserve.inputs import PromptInput
from mmserve.multimodal.handles import MediaHandle
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

GREEDY = SamplingParams(temperature=0, max_tokens=6)
PROMPT = "USER: <image>\nWhat is this? ASSISTANT:"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llava")


def data_url(seed: int) -> str:
    buf = io.BytesIO()
    make_image(seed).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def prompts(first_seed: int, count: int) -> list[PromptInput]:
    return [PromptInput(prompt=PROMPT, images=[make_image(first_seed + i)]) for i in range(count)]


def test_prompts_are_prepared_on_several_threads_at_once(llm, monkeypatch) -> None:
    intake = llm.engine.intake
    process = intake.front.processor.process
    together = threading.Barrier(2, timeout=10)  # broken unless two prepare at the same time

    def meet_then_process(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        together.wait()
        return process(prompt, *args, **kwargs)

    monkeypatch.setattr(intake.front.processor, "process", meet_then_process)
    batch = prompts(100, 4)
    processed = intake.process_all(batch, threads=2)
    monkeypatch.undo()
    assert [p.mm_items[0].hash for p in processed] == [
        intake.process(p).mm_items[0].hash for p in batch
    ]  # and in the prompts' order


def test_one_thread_prepares_in_order_on_the_calling_thread(llm, monkeypatch) -> None:
    intake = llm.engine.intake
    process = intake.front.processor.process
    seen: list[int] = []

    def record(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return process(prompt, *args, **kwargs)

    monkeypatch.setattr(intake.front.processor, "process", record)
    intake.process_all(prompts(200, 3), threads=1)
    assert seen == [threading.get_ident()] * 3


def test_a_prompt_naming_a_handle_runs_after_the_prompts_before_it_and_alone(
    llm, monkeypatch
) -> None:
    """It may name an image an earlier prompt registers, and register one a later prompt
    names: it starts once every prompt before it is done, and the ones after it start once it
    is done, as one at a time would have it."""
    intake = llm.engine.intake
    [item] = llm.encode([{"type": "image_url", "image_url": {"url": data_url(600)}}])
    process = intake.front.processor.process
    spans: dict[int, tuple[float, float]] = {}

    def timed(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        time.sleep(0.2)
        try:
            return process(prompt, *args, **kwargs)
        finally:
            spans[int(prompt.prompt.rsplit(" ", 1)[1])] = (start, time.monotonic())

    monkeypatch.setattr(intake.front.processor, "process", timed)
    images = [make_image(601), make_image(602), MediaHandle(handle=item["handle"])]
    images += [make_image(603), make_image(604)]
    batch = [PromptInput(prompt=f"{PROMPT} {i}", images=[im]) for i, im in enumerate(images)]
    intake.process_all(batch, threads=2)
    named_start, named_end = spans[2]
    assert all(spans[i][1] <= named_start for i in (0, 1))
    assert all(spans[i][0] >= named_end for i in (3, 4))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # these two overlapped


def test_generate_answers_a_batch_as_one_prompt_at_a_time(llm) -> None:
    batch = [{"prompt": PROMPT, "images": [make_image(400 + i)]} for i in range(4)]
    together = llm.generate(batch, GREEDY, use_tqdm=False)
    alone = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in batch]
    assert [o.outputs[0].token_ids for o in together] == [o.outputs[0].token_ids for o in alone]
    assert_no_leaks(llm)


def test_the_first_bad_prompt_in_order_is_raised_and_nothing_is_queued(llm) -> None:
    batch = [
        {"prompt": PROMPT, "images": [make_image(500)]},
        {"prompt": PROMPT, "images": ["mmserve://not-a-handle"]},
        {"prompt": PROMPT, "images": [b"not an image"]},
    ]
    with pytest.raises(ValueError, match="malformed media handle"):
        llm.generate(batch, GREEDY, use_tqdm=False)
    assert llm.get_metrics()["num_requests_waiting"] == 0
    assert_no_leaks(llm)


def test_bad_parameters_of_a_later_prompt_leave_no_earlier_prompt_queued(llm) -> None:
    """The prompts are queued one by one: a later prompt's parameters failing their check
    (``n`` above ``max_num_seqs``) took the batch down but left the earlier ones queued, to be
    run by the next call with nobody reading their outputs."""
    ok = SamplingParams(temperature=0, max_tokens=4)
    bad = SamplingParams(temperature=0, max_tokens=4, n=10_000)
    with pytest.raises(ValueError, match="n must be <= max_num_seqs"):
        llm.generate([PROMPT.replace("<image>", ""), "Second prompt"], [ok, bad], use_tqdm=False)
    assert llm.get_metrics()["num_requests_waiting"] == 0
    assert_no_leaks(llm)


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0, "max_tokens": 4},
        [SamplingParams(max_tokens=4), {"max_tokens": 4}],
        "greedy",
        (SamplingParams(max_tokens=4), None),
    ],
)
def test_sampling_params_of_another_type_are_a_value_error_before_anything_runs(
    llm, params
) -> None:
    """A dict (the OpenAI request's fields) where a ``SamplingParams`` belongs failed deep in
    the engine with ``AttributeError``, or was counted as that many prompts' parameters."""
    count = len(params) if isinstance(params, (list, tuple)) else 1
    with pytest.raises(ValueError, match="sampling_params must be a SamplingParams") as err:
        llm.generate(["First prompt", "Second prompt"][:count], params, use_tqdm=False)
    assert "got" in str(err.value)
    assert llm.get_metrics()["num_requests_waiting"] == 0
    assert_no_leaks(llm)
