"""Video sources: the fetch policy with the video byte limit and messages, local paths, data
URLs, http(s) through the SSRF policy, and admission (counts and settings checked before any
fetch, decoding off the loop, the memo, the frames handed to the engine)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from mmserve.cli import build_parser
from mmserve.engine.admission.pipeline import AdmissionExecutors, AdmissionPipeline
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.entrypoints.openai.serve_policies import media_policy
from mmserve.inputs import ProcessedPrompt, PromptInput, VideoFrames
from mmserve.multimodal.media.errors import MediaFetchError
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.media.limits import ImageTooLargeError, VideoTooLargeError
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.multimodal.video.memo import PreparedVideoMemo
from mmserve.multimodal.workers import MediaWorkers
from tests.multimodal.test_media_fetch import loopback_only  # noqa: F401 (autouse: no real network)
from tests.support.video import frame_index, make_video

VIDEO = make_video(90, 30)  # 3 s at 30 fps, 64x48
VIDEO_URL = "data:video/mp4;base64," + base64.b64encode(VIDEO).decode()
PUBLIC_IP = "93.184.215.14"  # answered in-process by the mock transport only
PROMPT = "<|vision_start|><|video_pad|><|vision_end|>Describe."


def indices(video: VideoFrames) -> list[int]:
    return [frame_index(f) for f in video.frames]


async def _public(host: str, port: int) -> list[str]:
    return ["127.0.0.1"] if host == "localhost" else [PUBLIC_IP]


def internet(body: bytes, seen: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host} {request.headers['host']}")
        return httpx.Response(200, content=body)

    return httpx.MockTransport(handle)


# ---------------------------------------------------------------- fetch policy for videos


def test_videos_have_their_own_byte_limit_and_messages(tmp_path: Path) -> None:
    policy = MediaFetchPolicy(
        allowed_local_path=tmp_path,
        max_bytes=1000,
        max_data_url_bytes=1000,
        max_video_bytes=len(VIDEO),
    )
    fetcher = MediaFetcher(policy)
    assert len(VIDEO) > 1000
    assert fetcher.read_offline(VIDEO_URL, "video") == VIDEO
    with pytest.raises(ImageTooLargeError, match="image data URL exceeds 1000"):
        fetcher.read_offline(VIDEO_URL)
    (tmp_path / "clip.mp4").write_bytes(VIDEO)
    assert fetcher.read_offline(str(tmp_path / "clip.mp4"), "video") == VIDEO
    small = MediaFetcher(MediaFetchPolicy(allowed_local_path=tmp_path, max_video_bytes=100))
    with pytest.raises(VideoTooLargeError, match="video data URL exceeds 100 bytes"):
        small.read_offline(VIDEO_URL, "video")
    with pytest.raises(VideoTooLargeError, match="exceeds 100 bytes"):
        small.read_offline(f"file://{tmp_path}/clip.mp4", "video")
    with pytest.raises(MediaFetchError, match="^could not read local video /etc/hostname$"):
        fetcher.read_offline("/etc/hostname", "video")
    with pytest.raises(MediaFetchError, match="invalid base64 in video data URL"):
        fetcher.read_offline("data:video/mp4;base64,@@", "video")


def test_video_urls_follow_the_ssrf_policy(bait) -> None:
    seen: list[str] = []
    policy = MediaFetchPolicy(max_bytes=100, max_video_bytes=len(VIDEO))
    fetcher = MediaFetcher(policy, resolver=_public, transport=internet(VIDEO, seen))
    url = "https://videos.example/clip.mp4"
    assert fetcher.load_blocking(url, "video") == VIDEO
    assert seen == [f"{PUBLIC_IP} videos.example"]  # sent to the checked address
    with pytest.raises(ImageTooLargeError):
        fetcher.load_blocking(url)  # the image limit still holds for images
    before = bait.connections
    for inward in (f"{bait.url}/clip.mp4", f"http://localhost:{bait.port}/clip.mp4"):
        with pytest.raises(MediaFetchError, match=f"^could not fetch video from {inward}$"):
            fetcher.load_blocking(inward, "video")
    assert bait.connections == before


def test_max_video_bytes_flag() -> None:
    args = build_parser().parse_args(["serve", "--max-video-bytes", "1MiB"])
    assert media_policy(args).max_video_bytes == 1 << 20
    default = media_policy(build_parser().parse_args(["serve"]))
    assert default.max_video_bytes == 128 << 20 and default.max_bytes == 20 << 20


# ---------------------------------------------------------------- admission


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLMEngine]:
    root = tmp_path_factory.mktemp("media")
    (root / "clip.mp4").write_bytes(VIDEO)
    policy = MediaFetchPolicy(allowed_local_path=root)
    yield LLMEngine.from_args(
        "tiny-qwen2-vl", limit_mm_per_prompt={"image": 2, "video": 2}, media_policy=policy
    )


class Handed:
    """Stands in for ``RequestIntake.process`` (video-core's processing): records what
    admission hands over."""

    def __init__(self) -> None:
        self.calls: list[PromptInput] = []

    def __call__(self, prompt: PromptInput) -> ProcessedPrompt:
        self.calls.append(prompt)
        return ProcessedPrompt([1, 2, 3], [])


def spy_decodes(engine: LLMEngine, fresh_memo: bool) -> tuple[list[VideoFrames], Any]:
    """The frames (decoded and sampled, or given) that admission preprocesses, in request
    order (lookups run in order in the one media thread), and a function that removes the
    spies; ``fresh_memo``: an empty memo first, so no video is a hit."""
    videos = engine.processor.videos
    decoded: list[Any] = []
    slots: dict[int, int] = {}
    real_lookup, real_finish = videos.lookup, videos.finish

    def lookup(*args: Any) -> Any:
        look = real_lookup(*args)
        slots[id(look)] = len(decoded)
        decoded.append(None)
        return look

    def finish(look: Any, frames: VideoFrames) -> Any:
        decoded[slots[id(look)]] = frames
        return real_finish(look, frames)

    memo = videos.memo
    if fresh_memo:
        videos.memo = PreparedVideoMemo()
    videos.lookup, videos.finish = lookup, finish  # type: ignore[method-assign]

    def restore() -> None:
        del videos.lookup, videos.finish
        videos.memo = memo

    return decoded, restore


def admit(
    engine: LLMEngine,
    videos: list[Any],
    mm_kwargs: Any = None,
    *,
    fetcher: MediaFetcher | None = None,
    workers: MediaWorkers | None = None,
    salt: str | None = None,
    handed: Handed | None = None,
    fresh_memo: bool = True,
) -> list[VideoFrames]:
    """Admit one prompt with ``videos`` (``intake.process`` stubbed); the videos decoded
    (None for a memo hit)."""
    fetcher = fetcher or MediaFetcher(engine.processor.media_policy)
    admission = AdmissionPipeline(lambda: engine.intake, AdmissionExecutors(1, 1), fetcher, workers)
    decoded, restore = spy_decodes(engine, fresh_memo)
    engine.intake.process = handed or Handed()  # type: ignore[method-assign]
    try:
        prompt = PromptInput(PROMPT, cache_salt=salt, mm_processor_kwargs=mm_kwargs, videos=videos)
        asyncio.run(admission.admit(prompt))
    finally:
        del engine.intake.process
        admission.shutdown()
        restore()
    return decoded


def test_admission_decodes_and_hands_the_videos_to_the_engine(engine: LLMEngine) -> None:
    root = engine.processor.media_policy.allowed_local_path
    handed = Handed()
    (data_url, path) = admit(engine, [VIDEO_URL, f"{root}/clip.mp4"], handed=handed)
    (prompt,) = handed.calls
    assert (prompt.prompt, list(prompt.images), prompt.uuids) == (PROMPT, [], None)
    assert (prompt.cache_salt, prompt.mm_processor_kwargs) == (None, None)
    assert len(prompt.videos) == 2  # the decoded videos (video-core preprocesses them first)
    for video in (data_url, path):
        assert isinstance(video, VideoFrames) and video.frames.shape == (6, 48, 64, 3)
        assert indices(video) == [0, 15, 30, 45, 60, 75]
        assert video.timestamps == pytest.approx([0, 0.5, 1, 1.5, 2, 2.5])
    (four,) = admit(engine, [VIDEO], {"num_frames": 4})
    assert indices(four) == [0, 22, 45, 67]
    (slow,) = admit(engine, [VIDEO], {"fps": 1.0, "min_frames": 2})
    assert indices(slow) == [0, 45] and slow.fps == pytest.approx(2 / 3)
    frames = np.zeros((2, 8, 8, 3), np.uint8)  # already decoded (the Python API)
    (given,) = admit(engine, [list(frames)])
    assert given.frames.shape == (2, 8, 8, 3) and given.timestamps == (0.0, 0.5)


def test_http_videos_are_fetched_under_the_policy(engine: LLMEngine) -> None:
    seen: list[str] = []
    fetcher = MediaFetcher(
        engine.processor.media_policy, resolver=_public, transport=internet(VIDEO, seen)
    )
    (video,) = admit(engine, ["HTTPS://videos.example/a.mp4"], fetcher=fetcher)
    assert indices(video) == [0, 15, 30, 45, 60, 75] and len(seen) == 1


def test_counts_and_settings_are_checked_before_any_fetch(engine: LLMEngine, bait) -> None:
    before = bait.connections
    loopback = MediaFetchPolicy(allowed_networks=("127.0.0.1/32",))
    fetcher = MediaFetcher(loopback)
    url = f"{bait.url}/clip.mp4"
    with pytest.raises(ValueError, match="3 videos exceed the limit of 2 per prompt"):
        admit(engine, [url] * 3, fetcher=fetcher)
    for bad in ({"fps": 0}, {"fps": 1, "num_frames": 4}, {"max_frames": 2, "min_frames": 4}):
        with pytest.raises(ValueError, match="mm_processor_kwargs"):
            admit(engine, [url], bad, fetcher=fetcher)
    assert bait.connections == before
    with pytest.raises(MediaFetchError, match="could not fetch video from"):
        admit(engine, [f"{bait.url}/missing.mp4"], fetcher=fetcher)  # 404: fetched, refused
    assert bait.connections == before + 1


def test_bad_videos_are_value_errors(engine: LLMEngine) -> None:
    for source, message in [
        (b"not a video", "could not decode the video"),
        ("data:video/mp4;base64," + base64.b64encode(VIDEO[:2000]).decode(), "could not decode"),
        ("/etc/hostname", "could not read local video"),
        (12, "unsupported video input"),
    ]:
        with pytest.raises(ValueError, match=message):
            admit(engine, [source])


def test_prepared_videos_are_memoized_per_tenant_and_setting(engine: LLMEngine) -> None:
    memo = engine.processor.videos.memo
    hits = memo.hits
    assert admit(engine, [VIDEO_URL, VIDEO_URL], fresh_memo=False)[0] is not None
    assert admit(engine, [VIDEO_URL], fresh_memo=False) == [None]  # a hit: not decoded
    assert admit(engine, [VIDEO], fresh_memo=False) == [None]  # the same bytes
    assert memo.hits >= hits + 2
    hits = memo.hits
    assert admit(engine, [VIDEO_URL], salt="tenant-b", fresh_memo=False)[0] is not None
    assert admit(engine, [VIDEO_URL], {"num_frames": 8}, fresh_memo=False)[0] is not None
    assert memo.hits == hits


def test_videos_decode_in_worker_processes(engine: LLMEngine) -> None:
    workers = MediaWorkers(engine.processor, 1)
    (video, again) = admit(engine, [VIDEO_URL, VIDEO_URL], {"num_frames": 10}, workers=workers)
    assert indices(video) == indices(again) == [0, 9, 18, 27, 36, 45, 54, 63, 72, 81]
    with pytest.raises(ValueError, match="could not decode the video"):
        admit(engine, [b"garbage" * 10], workers=MediaWorkers(engine.processor, 1))


def test_models_without_video_support_refuse_videos() -> None:
    llava = LLMEngine.from_args("tiny-llava")
    with pytest.raises(ValueError, match="does not accept videos"):
        admit(llava, [VIDEO])


def test_sampling_kwargs_share_the_video_processor_settings(engine: LLMEngine) -> None:
    """fps & co. choose frames; the processor settings (cached per kwargs) ignore them, so
    requests with ever new fps values cannot grow that cache."""
    videos = engine.processor.videos
    base = videos.settings(None)
    assert videos.settings({"fps": 1.0}) is base
    assert videos.settings({"fps": 3.5, "max_frames": 8, "do_sample_frames": True}) is base
    assert videos.settings({"max_pixels": 28 * 28 * 64}) is not base


@pytest.mark.parametrize(
    ("engine_kwargs", "request_kwargs", "rate"),
    [({"fps": 1.0}, {"num_frames": 8}, {"num_frames": 8}),
     ({"num_frames": 8}, {"fps": 1.0}, {"fps": 1.0}),
     ({"fps": 1.0, "max_pixels": 50176}, {"fps": 4.0}, {"fps": 4.0})],
)  # fmt: skip
def test_a_requests_frame_rate_setting_replaces_the_engines_other_one(
    engine_kwargs: dict, request_kwargs: dict, rate: dict
) -> None:
    """The engine's --mm-processor-kwargs fps and a request's num_frames (or the reverse) do
    not exclude each other: the request's choice wins (was: a 400)."""
    from mmserve.multimodal.request_kwargs import check_request_kwargs

    merged = check_request_kwargs("Qwen2VLForConditionalGeneration", engine_kwargs, request_kwargs)
    assert merged is not None
    assert {k: merged.get(k) for k in ("fps", "num_frames") if k in merged} == rate
    assert merged.get("max_pixels") == engine_kwargs.get("max_pixels")
