"""The one memo of prepared videos and the one content hash each video gets per request.

An encoded video (bytes, a data URL or a local path, read first) is hashed once: blake3 over
the model id, the video processor settings, the frame sampling and its bytes. That hash is both
its memo key (with the tenant's salt) and its content hash (``mm_hash``: encoder cache and
prefix blocks), as decoding the same bytes with the same sampling gives the same frames. Frames
given already decoded are hashed once, after sampling (``hash_video``). A memo hit skips
decoding and preprocessing.
"""

from __future__ import annotations

from dataclasses import dataclass

import blake3

from mmserve.inputs import VideoFrames
from mmserve.multimodal.memo import DEFAULT_MEMO_BYTES, ByteBoundedMemo
from mmserve.multimodal.video.onevision import OnevisionVideoSettings, PreparedOnevisionVideo
from mmserve.multimodal.video.prep import PreparedVideo
from mmserve.multimodal.video.qwen2_vl import VideoSettings
from mmserve.multimodal.video.sampling import VideoSampling
from mmserve.multimodal.video.smolvlm import SmolVideoSettings
from mmserve.multimodal.video.smolvlm_prep import PreparedSmolVideo

AnyPreparedVideo = PreparedVideo | PreparedOnevisionVideo | PreparedSmolVideo
AnyVideoSettings = VideoSettings | OnevisionVideoSettings | SmolVideoSettings


class PreparedVideoMemo(ByteBoundedMemo[AnyPreparedVideo]):
    """``ByteBoundedMemo`` of prepared videos by tenant salt + content hash, sized by their
    ``pixel_values``."""

    def __init__(self, max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        super().__init__(max_bytes, lambda prepared: int(prepared.pixel_values.nbytes))


def hash_encoded_video(
    data: bytes, model_id: str, settings: AnyVideoSettings, sampling: VideoSampling
) -> str:
    """256-bit blake3 of model id, processor settings, frame sampling and encoded bytes."""
    head = f"encoded-video\0{model_id}\0{settings.key()}\0{sampling.key()}\0"
    hasher = blake3.blake3(head.encode())
    hasher.update(data)
    return hasher.hexdigest()


def memo_key(mm_hash: str, cache_salt: str | None) -> str:
    """Per tenant, so a hit's timing says nothing across tenants."""
    return f"{cache_salt or ''}|{mm_hash}"


@dataclass(frozen=True)
class VideoLookup:
    """One video of a request after its content hash: the memo's entry on a hit, else what
    the miss needs: the encoded ``data`` to decode, or the (sampled) ``frames`` given."""

    mm_hash: str
    key: str
    settings: AnyVideoSettings
    sampling: VideoSampling
    hit: AnyPreparedVideo | None = None
    data: bytes | None = None
    frames: VideoFrames | None = None
