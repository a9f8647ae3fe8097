"""Typed inputs (no torch): what admission hands the scheduler and the worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class VideoGroup:
    """Where a ``MultiModalItem`` sits in its video: temporal frame group ``index`` of
    ``num_groups`` (the video's grid t), each group ``second_per_grid_t`` seconds apart."""

    index: int
    num_groups: int
    second_per_grid_t: float


@dataclass(frozen=True)
class MultiModalItem:
    """One image, or one temporal frame group of a video (``video`` set), of a prompt: its
    content hash and placeholder range [offset, offset+length). A video's groups are
    consecutive items with contiguous ranges; each is encoded and cached on its own. An image
    split into pan-and-scan crops is one item per crop (``crop``: its index, from 0). An item
    named by a media handle (``by_handle``) has no pixels: its ``data`` is the processor output
    without its large arrays, and it is never encoded, only found in the encoder cache or
    loaded from ``stored``, which it holds for the request's whole life."""

    hash: str
    offset: int
    length: int
    data: Any = None  # processor output (e.g. pixel_values array) the encoder consumes
    video: VideoGroup | None = None
    crop: int | None = None
    # the embedding the encoder store returned (a host tensor): loaded instead of encoded
    stored: Any = field(default=None, compare=False, repr=False)
    # a future of the embedding another replica holds the store's encode lease for (the
    # tensor, or None: encode here); the item is not scheduled before it resolves
    awaited: Any = field(default=None, compare=False, repr=False)
    by_handle: bool = False

    @property
    def modality(self) -> str:
        return "image" if self.video is None else "video"

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def key(self) -> str:
        """Encoder-cache key: the content hash and the embedding count, so two items whose
        hashes collide but whose lengths differ are two entries, never a wrong splice."""
        return f"{self.hash}:{self.length}"


@dataclass
class ProcessedPrompt:
    """A prompt after admission: token ids with each image's and video's placeholders
    expanded, and one ``MultiModalItem`` per image and per video frame group in prompt order."""

    prompt_token_ids: list[int]
    mm_items: list[MultiModalItem]
    store_lookup: Any = None  # the encoder store's pending lookups (a StoreLookup), if any
    cache_salt: str | None = None  # the tenant's, set at admission: scopes the block hashes


@dataclass(frozen=True)
class VideoFrames:
    """One decoded video as the processors take it: the sampled frames (``[T, H, W, 3]`` uint8
    array or a list of PIL images, in time order), the rate they were sampled at and each
    frame's time in seconds from the start (Qwen2.5-VL's absolute-time positions and Qwen3-VL's
    timestamps come from these), and the video's duration where known (SmolVLM2 writes it)."""

    frames: Any
    fps: float
    timestamps: tuple[float, ...]
    duration: float | None = None  # of the whole video, in seconds (the decoder sets it)


@dataclass(frozen=True)
class ImageEmbeds:
    """One image given as its precomputed encoder output (vLLM's ``image_embeds``): a
    ``(tokens, hidden)`` tensor, as the model's vision encoder and projector would make it, and
    for families whose token count depends on the image size (Qwen-VL) the image's
    ``image_grid_thw`` ``(1, h, w)``. Admission checks both against the model and keys the
    image by a hash of the tensor (``mmserve.engine.admission.embeds``)."""

    embeds: Any
    image_grid_thw: Any = None


@dataclass
class PromptInput:
    """One prompt as the APIs take it: text or token ids, its images and videos (any source
    admission reads; a video may also be a ``VideoFrames`` or a list of frames) in prompt
    order, optional per-image uuids, the tenant's cache salt and this prompt's processor
    settings (``mm_processor_kwargs``, merged over the engine's)."""

    prompt: str | list[int]
    images: list[Any] = field(default_factory=list)
    uuids: list[str | None] | None = None
    cache_salt: str | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    videos: list[Any] = field(default_factory=list)

    @property
    def media(self) -> list[Any]:
        """The prompt's images, then its videos (as sent: sources, prepared, or handles)."""
        return [*self.images, *self.videos]

    @classmethod
    def of(cls, prompt: Any) -> PromptInput:
        """A str / token-id list / ``{"prompt" | "prompt_token_ids", "images" | "videos" |
        "multi_modal_data" ({"image": ..., "video": ...}), "uuids", "cache_salt",
        "mm_processor_kwargs"}`` dict -> PromptInput."""
        if isinstance(prompt, cls):
            return prompt
        if isinstance(prompt, (str, list)):
            return cls(prompt)
        if isinstance(prompt, dict):
            text = prompt.get("prompt", prompt.get("prompt_token_ids"))
            if text is None:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
            mm_data = prompt.get("multi_modal_data", {})
            images = prompt.get("images", mm_data.get("image", []))
            images = list(images) if isinstance(images, (list, tuple)) else [images]
            videos = prompt.get("videos", mm_data.get("video", []))
            # one video may itself be a list of frames: a list of lists (or of [T, H, W, 3]
            # arrays) is several videos
            if not isinstance(videos, (list, tuple)) or (
                videos
                and not isinstance(videos[0], (list, tuple, VideoFrames, str, bytes))
                and getattr(videos[0], "ndim", None) != 4
            ):
                videos = [videos]
            return cls(
                text,
                images,
                prompt.get("uuids"),
                prompt.get("cache_salt"),
                prompt.get("mm_processor_kwargs"),
                list(videos),
            )
        raise ValueError(f"unsupported prompt of type {type(prompt).__name__}")
