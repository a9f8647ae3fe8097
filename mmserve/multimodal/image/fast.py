"""The model's image processor redone for one image in a few vectorized uint8 / float32 passes.

Covers what the transformers PIL processors do for the supported models (``CLIPImageProcessor``
for LLaVA in ``fast_clip``, ``Qwen2VLImageProcessor`` in ``fast_qwen2_vl``, and the LLaVA-NeXT /
OneVision anyres tiling in ``fast_anyres``): RGB conversion, resize, center crop, rescale,
normalize and Qwen2-VL's patchify. This module builds them from the loaded processor object's
settings (so ``preprocessor_config.json`` and the user's ``processor_kwargs`` both apply).
Output shapes and dtypes are the processor's.

Modes (``PREPROCESSING_MODES``):

- ``"exact"`` (default): the resize is the processor's own PIL call, so pixel values are
  bit-identical to the processor's and greedy outputs token-identical.
- ``"fast"`` (opt-in, NOT token-identical): BICUBIC and BILINEAR resizes run torch's antialiased
  uint8 kernel (PIL's filters and separable passes, run here in PIL's pass order, with 16-bit
  instead of PIL's 22-bit fixed-point weights; vectorized where PIL is scalar). Its uint8
  result is at most ``FAST_RESIZE_MAX_LEVELS`` (2) levels off PIL's, on about 1% of the values or
  fewer, so pixel values are within ``2 * rescale_factor / min(image_std)`` of the processor's
  (0.0300 with CLIP's mean and std). That is enough to change greedy tokens of the tiny
  random-weight test models on some images (their std-0.2 weights amplify input noise); the
  ~5x faster LLaVA resize is for deployments that accept it. Other filters use PIL's resize.
  The content hash does not include the mode: processes sharing an encoder store should use one.
- ``"hf"``: the transformers processor itself.

After the resize both fast modes repeat the processor's arithmetic bit for bit: the rescale (a
float32 division where that equals the processor's float64 product rounded to float32, as it does
for 1/255, else that product), then ``(x - mean) / std`` in float32; Qwen2-VL's patches are cut
from the uint8 image and normalized once before the temporal copy. The speed comes from skipping
the processor's array round trips (PIL -> numpy -> PIL), float64 temporaries and transposed float
copies, and in ``"fast"`` from the vectorized resize.

A processor or a setting this module does not implement (padding, ``size`` as longest edge or
max height/width, rescale and normalize both off, a processor class it does not know) makes
``fast_image_processor`` return None, and the caller uses the HF processor; so does an image in
a non-RGB mode when ``do_convert_rgb`` is off (``accepts``).

Not done here: JPEG ``draft`` (DCT-domain downscaling while decoding) would be faster still but
changes pixels, and the content hash needs the full decoded image anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import transformers
from PIL import Image
from transformers.image_utils import ChannelDimension

from mmserve.multimodal.image.fast_anyres import AnyresImageProcessing
from mmserve.multimodal.image.fast_clip import ClipImageProcessing
from mmserve.multimodal.image.fast_pixels import TORCH_FILTERS, PixelSteps
from mmserve.multimodal.image.fast_qwen2_vl import Qwen2VLImageProcessing

logger = logging.getLogger(__name__)

PREPROCESSING_MODES = ("fast", "exact", "hf")
DEFAULT_PREPROCESSING = "exact"

# Processor settings that change nothing for one PIL image processed to numpy: any value passes.
_IGNORED = {"default_to_square", "return_tensors", "image_seq_length", "disable_grouping"}
# Settings that must hold one of these values, or the fast path does not apply.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "data_format": (None, "channels_first", ChannelDimension.FIRST),
    "input_data_format": (None,),
    "device": (None,),
}


FastImageProcessing = ClipImageProcessing | Qwen2VLImageProcessing | AnyresImageProcessing


def processor_settings(image_processor: Any) -> dict[str, Any]:
    """Every setting the processor's ``preprocess`` would use for a call without overrides, in
    the processor's own standardized form."""
    names = getattr(image_processor, "_valid_kwargs_names", None) or list(
        image_processor.valid_kwargs.__annotations__
    )
    settings = {name: getattr(image_processor, name, None) for name in names}
    return dict(image_processor._standardize_kwargs(**settings))


def fast_image_processor(
    image_processor: Any, mode: str = DEFAULT_PREPROCESSING
) -> FastImageProcessing | None:
    """The fast equivalent of ``image_processor``, or None where the HF processor must run:
    ``mode == "hf"``, or a processor class (exactly; not a subclass) or setting not covered."""
    if mode not in PREPROCESSING_MODES:
        raise ValueError(
            f"image preprocessing mode must be one of {PREPROCESSING_MODES}, got {mode!r}"
        )
    if mode == "hf" or image_processor is None:
        return None
    name = type(image_processor).__name__
    builder = _BUILDERS.get(type(image_processor))
    if builder is None:
        logger.info("image preprocessing: no fast path for %s, it runs as is", name)
        return None
    try:
        return builder(processor_settings(image_processor), mode)
    except _Unsupported as exc:
        logger.info("image preprocessing: %s has %s, the HF processor runs", name, exc)
    except (AttributeError, TypeError) as exc:  # transformers internals moved: stay correct
        logger.warning("image preprocessing: cannot read %s's settings (%s)", name, exc)
    return None


class _Unsupported(Exception):
    """A processor setting the fast path does not implement."""


def _pixels(settings: dict[str, Any], mode: str, used: set[str]) -> PixelSteps:
    """The common settings; raises ``_Unsupported`` for any setting outside ``used`` (and the
    common ones) that is not neutral."""
    used = used | {"do_convert_rgb", "resample", "do_rescale", "rescale_factor"}
    used |= {"do_normalize", "image_mean", "image_std", "do_resize", "size"}
    for name, value in settings.items():
        if name in used or name in _IGNORED:
            continue
        if value not in _NEUTRAL.get(name, (None, False)):
            raise _Unsupported(f"{name}={value!r}")
    resample = settings.get("resample")
    resample = int(Image.Resampling.BILINEAR) if resample is None else resample
    if not isinstance(resample, int) or resample not in {int(f) for f in Image.Resampling}:
        raise _Unsupported(f"resample={resample!r}")
    rescale = float(settings["rescale_factor"]) if settings.get("do_rescale") else None
    mean = std = None
    if settings.get("do_normalize"):
        mean, std = _channels(settings.get("image_mean")), _channels(settings.get("image_std"))
    if rescale is None and mean is None:
        raise _Unsupported("do_rescale=do_normalize=False (uint8 output)")
    return PixelSteps(
        convert_rgb=bool(settings.get("do_convert_rgb")),
        resample=int(resample),
        resize_with_torch=mode == "fast" and int(resample) in TORCH_FILTERS,
        rescale_factor=rescale,
        rescale_divisor=_float32_divisor(rescale),
        mean=mean,
        std=std,
    )


def _float32_divisor(scale: float | None) -> float | None:
    """``1 / scale`` in float32 where ``float32(v) / it`` equals the processor's rescale
    (``float32(float64(v) * scale)``) for every uint8 ``v`` (true of 1/255); else None."""
    if not scale:
        return None
    values = np.arange(256, dtype=np.uint8)
    divisor = np.float32(1 / scale)
    want = (values.astype(np.float64) * scale).astype(np.float32)
    if np.array_equal(np.divide(values, divisor, dtype=np.float32), want):
        return float(divisor)
    return None


def _channels(value: Any) -> tuple[float, ...]:
    """A per-channel mean / std as 3 floats (a scalar applies to every channel)."""
    if isinstance(value, (int, float)):
        return (float(value),) * 3
    values = tuple(float(v) for v in value) if value is not None else ()
    if len(values) != 3:
        raise _Unsupported(f"mean/std {value!r}")
    return values


def _size(value: Any) -> dict[str, int]:
    """The non-empty fields of a ``SizeDict`` (or dict)."""
    return {k: int(v) for k, v in dict(value or {}).items() if v is not None}


def _clip(settings: dict[str, Any], mode: str) -> ClipImageProcessing:
    shortest_edge = size = crop = None
    if settings.get("do_resize"):
        fields = _size(settings.get("size"))
        if fields.keys() == {"shortest_edge"}:
            shortest_edge = fields["shortest_edge"]
        elif fields.keys() == {"height", "width"}:
            size = (fields["height"], fields["width"])
        else:
            raise _Unsupported(f"size={settings.get('size')!r}")
    if settings.get("do_center_crop"):
        fields = _size(settings.get("crop_size"))
        if fields.keys() != {"height", "width"}:
            raise _Unsupported(f"crop_size={settings.get('crop_size')!r}")
        crop = (fields["height"], fields["width"])
    pixels = _pixels(settings, mode, {"do_center_crop", "crop_size", "pad_size"})
    return ClipImageProcessing(pixels, shortest_edge, size, crop)


def _qwen2_vl(settings: dict[str, Any], mode: str) -> Qwen2VLImageProcessing:
    if not settings.get("do_resize"):
        raise _Unsupported("do_resize=False")
    fields = _size(settings.get("size"))
    if not {"shortest_edge", "longest_edge"} <= fields.keys():
        raise _Unsupported(f"size={settings.get('size')!r}")
    # its preprocessing ignores crop and pad settings; min/max_pixels are folded into size
    used = {"do_center_crop", "crop_size", "do_pad", "pad_size", "min_pixels", "max_pixels"}
    used |= {"patch_size", "merge_size", "temporal_patch_size"}
    return Qwen2VLImageProcessing(
        pixels=_pixels(settings, mode, used),
        min_pixels=fields["shortest_edge"],
        max_pixels=fields["longest_edge"],
        patch_size=int(settings["patch_size"]),
        merge_size=int(settings["merge_size"]),
        temporal_patch_size=int(settings["temporal_patch_size"]),
    )


def _anyres(settings: dict[str, Any], mode: str) -> AnyresImageProcessing:
    """LLaVA-NeXT / OneVision: crops of one square size, which every per-crop resize and center
    crop leaves as they are."""
    fields, crop = _size(settings.get("size")), _size(settings.get("crop_size"))
    side = fields.get("shortest_edge") or fields.get("height")
    if not settings.get("do_resize") or side is None or set(fields.values()) != {side}:
        raise _Unsupported(f"do_resize={settings.get('do_resize')}, size={fields}")
    if (crop or settings.get("do_center_crop")) and crop != {"height": side, "width": side}:
        raise _Unsupported(f"crop_size={crop}")
    used = {"do_center_crop", "crop_size", "do_pad", "pad_size", "image_grid_pinpoints"}
    pinpoints = tuple((int(h), int(w)) for h, w in settings["image_grid_pinpoints"])
    mean = settings.get("image_mean")
    pad_color = None if mean is None else _pad_color(mean)
    return AnyresImageProcessing(_pixels(settings, mode, used), side, pinpoints, pad_color)


def _pad_color(mean: Any) -> tuple[int, int, int]:
    """OneVision's ``pad_to_square`` color: ``int(x * 255)`` of each channel's mean."""
    red, green, blue = (int(x * 255) for x in _channels(mean))
    return red, green, blue


_BUILDERS: dict[type, Callable[[dict[str, Any], str], FastImageProcessing]] = {
    transformers.CLIPImageProcessorPil: _clip,
    transformers.Qwen2VLImageProcessorPil: _qwen2_vl,
    transformers.LlavaOnevisionImageProcessorPil: _anyres,
    transformers.LlavaNextImageProcessorPil: _anyres,
}
