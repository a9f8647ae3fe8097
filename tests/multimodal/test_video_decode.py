"""Video decoding (PyAV) and frame sampling: which frames, their times, and the limits."""

from __future__ import annotations

import io
import json
import types
from pathlib import Path

import av
import numpy as np
import pytest

from mmserve.multimodal.media.limits import VideoTooLargeError
from mmserve.multimodal.video.decode import VideoLimits, decode_video
from mmserve.multimodal.video.sampling import VideoSampling
from tests.support.video import frame_index, hf_sample_frames, make_video

HF_SAMPLE = hf_sample_frames()
TOTALS = (2, 3, 4, 5, 7, 8, 9, 16, 30, 31, 89, 90, 91, 97, 299, 301, 1000, 1799, 5000, 10007)
RATES = (1.0, 10.0, 23.976, 24.0, 29.97, 30.0, 60.0)


@pytest.mark.parametrize(
    "settings",
    [
        {"fps": 2.0},
        {"fps": 0.5},
        {"fps": 3.3, "max_frames": 6},
        {"fps": 1.0, "min_frames": 8, "max_frames": 64},
        {"num_frames": 2},
        {"num_frames": 7},
        {"num_frames": 8},
        {"num_frames": 31},
    ],
)
def test_indices_are_transformers_sample_frames(settings: dict) -> None:
    sampling = VideoSampling().with_kwargs(settings)
    compared = 0
    for total in TOTALS:
        for rate in RATES:
            try:
                expected = HF_SAMPLE(total, rate, **settings)
            except (ValueError, ZeroDivisionError):  # transformers refuses: see the next test
                continue
            assert sampling.indices(total, rate) == expected, (total, rate)
            compared += 1
    assert compared >= len(TOTALS) * len(RATES) // 2


def test_where_transformers_refuses_all_frames_up_to_the_count_are_taken() -> None:
    with pytest.raises(ZeroDivisionError):
        HF_SAMPLE(1, 30.0, fps=2.0)  # 0 frames after rounding to the temporal patch
    assert VideoSampling().indices(1, 30.0) == [0]
    with pytest.raises(ValueError):
        HF_SAMPLE(5, 30.0, num_frames=8)
    assert VideoSampling(fps=None, num_frames=8).indices(5, 30.0) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "container,codec",
    [("mp4", "libx264"), ("mp4", "mpeg4"), ("webm", "libvpx"), ("webm", "libvpx-vp9")],
)
def test_decode_returns_the_sampled_frames_with_their_times(container: str, codec: str) -> None:
    data = make_video(90, 30, container=container, codec=codec)  # 3 s
    video = decode_video(data, VideoSampling())
    assert video.frames.dtype == np.uint8 and video.frames.shape == (6, 48, 64, 3)
    chosen = [frame_index(f) for f in video.frames]
    assert chosen == HF_SAMPLE(90, 30.0, fps=2.0) == [0, 15, 30, 45, 60, 75]
    assert video.timestamps == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert video.fps == pytest.approx(2.0)


def test_decode_follows_num_frames_and_max_frames() -> None:
    data = make_video(90, 30)
    video = decode_video(data, VideoSampling().with_kwargs({"num_frames": 10}))
    assert [frame_index(f) for f in video.frames] == HF_SAMPLE(90, 30.0, num_frames=10)
    video = decode_video(data, VideoSampling(fps=30.0, max_frames=12))
    expected = HF_SAMPLE(90, 30.0, fps=30.0, max_frames=12)
    assert [frame_index(f) for f in video.frames] == expected == [int(i * 7.5) for i in range(12)]
    assert video.fps == pytest.approx(4.0)
    assert video.timestamps == pytest.approx([i / 30 for i in expected])


def test_sampling_settings_checked_and_merged() -> None:
    base = VideoSampling()
    assert base.with_kwargs({"num_frames": 8}) == VideoSampling(fps=None, num_frames=8)
    assert base.with_kwargs({"num_frames": 8}).with_kwargs({"fps": 1}).num_frames is None
    assert base.with_kwargs({"min_pixels": 100}) is base  # image keys are not sampling keys
    assert base.with_kwargs({"do_sample_frames": True}) is base  # what vLLM clients send
    with pytest.raises(ValueError, match="do_sample_frames must be true"):
        base.with_kwargs({"do_sample_frames": False})
    with pytest.raises(ValueError, match="fps and num_frames"):
        base.with_kwargs({"fps": 1.0, "num_frames": 4})
    for bad in ({"fps": 0}, {"fps": "2"}, {"fps": float("inf")}, {"max_frames": 0},
                {"min_frames": 1.5}, {"num_frames": True}, {"min_frames": 800}):  # fmt: skip
        with pytest.raises(ValueError, match="mm_processor_kwargs: video"):
            base.with_kwargs(bad)


def test_settings_from_the_checkpoint_then_the_engine_kwargs(tmp_path: Path) -> None:
    processor = types.SimpleNamespace(temporal_patch_size=4)
    assert VideoSampling.from_checkpoint(tmp_path, processor) == VideoSampling(
        temporal_patch_size=4
    )
    (tmp_path / "video_preprocessor_config.json").write_text(
        json.dumps({"fps": 1.0, "max_frames": 64, "temporal_patch_size": 2, "size": {}})
    )
    sampling = VideoSampling.from_checkpoint(tmp_path, processor, {"min_frames": 2})
    assert sampling == VideoSampling(fps=1.0, min_frames=2, max_frames=64)


@pytest.mark.parametrize(
    "limits,size,message",
    [
        (VideoLimits(max_frame_pixels=64 * 48 - 1), (64, 48), "64x48 pixels exceed"),
        (VideoLimits(max_frames=89), (64, 48), "90 frames, more than 89"),
        (VideoLimits(max_duration_s=2.5), (64, 48), "lasts 3.0 s"),
        (VideoLimits(max_output_bytes=6 * 64 * 48 * 3 - 1), (64, 48), "6 sampled frames"),
        (VideoLimits(max_decode_s=1e-9), (64, 48), "time limit"),
    ],
)
def test_limits_are_value_errors(limits: VideoLimits, size: tuple, message: str) -> None:
    data = make_video(90, 30, size=size)
    with pytest.raises(VideoTooLargeError, match=message):
        decode_video(data, VideoSampling(), limits)


def test_frame_count_limit_holds_without_a_count_in_the_header() -> None:
    data = make_video(90, 30, container="webm", codec="libvpx")  # WebM: no frame count
    with av.open(io.BytesIO(data)) as probe:
        assert probe.streams.video[0].frames == 0
    with pytest.raises(VideoTooLargeError, match="more than 50 frames"):
        decode_video(data, VideoSampling(), VideoLimits(max_frames=50))


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00garbage" * 100, make_video(90, 30)[:1500], make_video(90, 30)[:-600]],
    ids=["empty", "garbage", "head", "tail-cut"],
)
def test_corrupt_and_truncated_videos_are_value_errors(data: bytes) -> None:
    with pytest.raises(ValueError, match="video"):
        decode_video(data, VideoSampling())


def test_truncated_stream_with_an_intact_header_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "faststart.mp4"  # index first: the header promises 90 frames
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(90):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i, np.uint8), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    data = path.read_bytes()
    assert decode_video(data, VideoSampling()).frames.shape[0] == 6
    with pytest.raises(ValueError, match="could not decode the video"):
        decode_video(data[: len(data) * 2 // 3], VideoSampling())


def test_containers_that_open_other_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.mp4").write_bytes(make_video(90, 30))
    monkeypatch.chdir(tmp_path)
    playlist = b"ffconcat version 1.0\nfile x.mp4\n"
    with av.open(io.BytesIO(playlist)) as plain:  # FFmpeg alone would read the file
        assert sum(1 for _ in plain.decode(video=0)) == 90
    with pytest.raises(ValueError, match="not a supported container format"):
        decode_video(playlist, VideoSampling())
    hls = b"#EXTM3U\n#EXT-X-TARGETDURATION:3\n#EXTINF:3,\nx.mp4\n#EXT-X-ENDLIST\n"
    with pytest.raises(ValueError, match="could not decode the video"):
        decode_video(hls, VideoSampling())


def _with_audio(video: bool) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        sound = out.add_stream("aac", rate=16000)
        picture = out.add_stream("libx264", rate=30) if video else None
        if picture is not None:
            picture.width, picture.height, picture.pix_fmt = 64, 48, "yuv420p"
        for i in range(30):
            chunk = av.AudioFrame.from_ndarray(
                np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
            )
            chunk.sample_rate, chunk.pts = 16000, i * 1024
            out.mux(sound.encode(chunk))
            if picture is not None:
                level = np.full((48, 64, 3), 255 if i == 20 else 0, np.uint8)
                out.mux(picture.encode(av.VideoFrame.from_ndarray(level, format="rgb24")))
        out.mux(sound.encode())
        if picture is not None:
            out.mux(picture.encode())
    return buf.getvalue()


def test_audio_is_skipped_and_audio_only_files_are_refused() -> None:
    video = decode_video(_with_audio(True), VideoSampling(fps=None, num_frames=30))
    assert video.frames.shape == (30, 48, 64, 3)
    assert [int(f.mean() > 128) for f in video.frames].index(1) == 20
    with pytest.raises(ValueError, match="no video stream"):
        decode_video(_with_audio(False), VideoSampling())


@pytest.mark.parametrize("container,codec", [("mp4", "libx264"), ("webm", "libvpx")])
def test_damaged_videos_decode_or_are_value_errors(container: str, codec: str) -> None:
    """Random byte changes anywhere: frames of the sampled shape or a ValueError, nothing else
    (a damaged codec id once gave an AttributeError)."""
    data = make_video(90, 30, container=container, codec=codec)
    rng = np.random.default_rng(7)
    outcomes = set()
    for _ in range(150):
        damaged = bytearray(data)
        for _ in range(int(rng.integers(1, 20))):
            damaged[int(rng.integers(0, len(damaged)))] = int(rng.integers(0, 256))
        try:
            video = decode_video(bytes(damaged), VideoSampling())
        except ValueError:
            outcomes.add("refused")
        else:
            frames = video.frames  # a damaged header may name another size: that one
            assert frames.dtype == np.uint8 and frames.ndim == 4 and frames.shape[3] == 3
            assert len(video.timestamps) == len(frames) >= 1
            outcomes.add("decoded")
    assert outcomes == {"refused", "decoded"}
