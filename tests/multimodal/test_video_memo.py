"""One memo and one content hash per video per request: admission (media threads or worker
processes) and the offline path look a video up once by its content and decode only on a
miss."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from mmserve.engine.admission.pipeline import AdmissionExecutors, AdmissionPipeline
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.multimodal.video import source as video_source
from mmserve.multimodal.workers import MediaWorkers
from tests.support.video import make_video

VIDEO = make_video(90, 30)  # 3 s at 30 fps, 64x48
VIDEO_URL = "data:video/mp4;base64," + base64.b64encode(VIDEO).decode()
OTHER = make_video(120, 30)  # 4 s
PROMPT = "<|vision_start|><|video_pad|><|vision_end|>Describe."
CONTENT = 4096  # bytes: a hasher fed at least this much hashed video content, not a key


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLMEngine]:
    root = tmp_path_factory.mktemp("media")
    (root / "clip.mp4").write_bytes(VIDEO)
    policy = MediaFetchPolicy(allowed_local_path=root)
    yield LLMEngine.from_args(
        "tiny-qwen2-vl", limit_mm_per_prompt={"video": 2}, media_policy=policy
    )


class Counts:
    """Content hashes (blake3 hashers fed >= ``CONTENT`` bytes) and in-process decodes."""

    def __init__(self) -> None:
        self.hashers: list[Any] = []
        self.decodes = 0

    @property
    def hashes(self) -> int:
        return sum(h.size >= CONTENT for h in self.hashers)

    def reset(self) -> None:
        self.hashers.clear()
        self.decodes = 0


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    found = Counts()
    real_hasher, real_decode = blake3.blake3, video_source.decode_video

    class Counting:
        def __init__(self, data: Any = b"", **kwargs: Any) -> None:
            self._hasher = real_hasher(**kwargs)
            self.size = 0
            found.hashers.append(self)
            self.update(data)

        def update(self, data: Any) -> Counting:
            self.size += memoryview(data).nbytes
            self._hasher.update(data)
            return self

        def hexdigest(self, *args: Any, **kwargs: Any) -> str:
            return str(self._hasher.hexdigest(*args, **kwargs))

        def digest(self, *args: Any, **kwargs: Any) -> bytes:
            return bytes(self._hasher.digest(*args, **kwargs))

    def decode(*args: Any, **kwargs: Any) -> Any:
        found.decodes += 1
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(blake3, "blake3", Counting)
    monkeypatch.setattr(video_source, "decode_video", decode)
    return found


def admit(
    engine: LLMEngine, videos: list[Any], salt: str, workers: MediaWorkers | None = None
) -> ProcessedPrompt:
    fetcher = MediaFetcher(engine.processor.media_policy)
    admission = AdmissionPipeline(lambda: engine.intake, AdmissionExecutors(1, 1), fetcher, workers)
    try:
        prompt = PromptInput(PROMPT * len(videos), cache_salt=salt, videos=videos)
        return asyncio.run(admission.admit(prompt))
    finally:
        admission.executors.shutdown()  # the workers are the caller's


def sources(engine: LLMEngine) -> dict[str, Any]:
    root = engine.processor.media_policy.allowed_local_path
    frames = list(np.random.default_rng(0).integers(0, 255, (4, 48, 64, 3), np.uint8))
    return {"bytes": VIDEO, "data url": VIDEO_URL, "path": f"{root}/clip.mp4", "frames": frames}


@pytest.mark.parametrize("kind", ["bytes", "data url", "path", "frames"])
def test_admission_hashes_a_video_once_and_a_repeat_is_not_decoded(
    engine: LLMEngine, counts: Counts, kind: str
) -> None:
    source = sources(engine)[kind]
    first = admit(engine, [source], salt=f"once-{kind}")
    assert counts.hashes == 1, [h.size for h in counts.hashers]
    assert counts.decodes == (0 if kind == "frames" else 1)
    counts.reset()
    again = admit(engine, [source], salt=f"once-{kind}")
    assert (counts.hashes, counts.decodes) == (1, 0)
    assert [i.key for i in again.mm_items] == [i.key for i in first.mm_items]
    assert again.prompt_token_ids == first.prompt_token_ids


def test_two_videos_in_one_request_are_two_hashes(engine: LLMEngine, counts: Counts) -> None:
    admit(engine, [VIDEO, "data:video/mp4;base64," + base64.b64encode(OTHER).decode()], "two")
    assert (counts.hashes, counts.decodes) == (2, 2)


def test_the_offline_path_hashes_once_and_decodes_a_repeat_zero_times(
    engine: LLMEngine, counts: Counts
) -> None:
    processor = engine.processor
    first = processor.process(PromptInput(PROMPT, videos=[VIDEO], cache_salt="offline"))
    assert (counts.hashes, counts.decodes) == (1, 1)
    counts.reset()
    again = processor.process(PromptInput(PROMPT, videos=[VIDEO], cache_salt="offline"))
    assert (counts.hashes, counts.decodes) == (1, 0)
    assert [i.key for i in again.mm_items] == [i.key for i in first.mm_items]


def test_worker_decodes_are_hashed_once_in_the_server_and_not_repeated(
    engine: LLMEngine, counts: Counts, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = MediaWorkers(engine.processor, 1)
    runs: list[Any] = []
    real = workers.run_video

    async def run_video(*args: Any) -> Any:
        runs.append(args[0])
        return await real(*args)

    monkeypatch.setattr(workers, "run_video", run_video)
    root = Path(engine.processor.media_policy.allowed_local_path or ".")
    try:
        for salt, source in (("w-bytes", VIDEO), ("w-path", f"{root}/clip.mp4")):
            counts.reset()
            runs.clear()
            admit(engine, [source], salt, workers)
            assert (counts.hashes, len(runs)) == (1, 1)
            counts.reset()
            runs.clear()
            admit(engine, [source], salt, workers)
            assert (counts.hashes, len(runs)) == (1, 0)
    finally:
        workers.shutdown()
