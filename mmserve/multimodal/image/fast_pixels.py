"""The pixel steps every fast image processor shares: RGB conversion, resize (PIL's own call,
or torch's antialiased uint8 kernel in PIL's pass order for the "fast" mode), rescale and
normalize, each repeating the HF processor's arithmetic (see ``image.fast``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import PIL
import torch
from PIL import Image
from transformers.image_transforms import convert_to_rgb

FAST_RESIZE_MAX_LEVELS = 2  # uint8 levels between torch's antialiased resize and PIL's
_PILLOW = tuple(int(part) for part in PIL.__version__.split(".")[:2])
TORCH_FILTERS = {
    int(Image.Resampling.BICUBIC): "bicubic",
    int(Image.Resampling.BILINEAR): "bilinear",
}


@dataclass(frozen=True)
class PixelSteps:
    """What every processor here does to pixels: RGB conversion, resize filter, rescale and
    normalize (None: that step is off)."""

    convert_rgb: bool
    resample: int
    resize_with_torch: bool
    rescale_factor: float | None
    rescale_divisor: float | None  # float32 division giving the same values (cheaper)
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None

    def accepts(self, image: Image.Image) -> bool:
        return self.convert_rgb or image.mode == "RGB"

    def plain(self, image: Image.Image) -> bool:
        """The processor takes this image's pixels as they are (no conversion)."""
        return image.mode == "RGB" and not (
            self.convert_rgb and image.info.get("transparency") is not None
        )

    def rgb(self, image: Image.Image, pixels: bytes | None) -> np.ndarray:
        """(H, W, 3) uint8 as the processor sees it: with ``do_convert_rgb``, transparency is
        composited onto white (transformers' ``convert_to_rgb``). ``pixels``: ``image.tobytes()``
        if the caller has it already (read-only result then)."""
        if self.plain(image):
            data = image.tobytes() if pixels is None else pixels
            return np.frombuffer(data, np.uint8).reshape(image.height, image.width, 3)
        return np.asarray(convert_to_rgb(image, return_numpy=True))

    def resize(
        self, image: Image.Image, pixels: bytes | None, height: int, width: int
    ) -> np.ndarray:
        """``rgb(image, pixels)`` resized to (height, width, 3) uint8, possibly a strided view
        (PIL resizes ``image`` itself where that is plain RGB)."""
        if self.resize_with_torch:
            rgb = self.rgb(image, pixels)
            return _torch_resize(rgb, height, width, TORCH_FILTERS[self.resample])
        source = image if self.plain(image) else Image.fromarray(self.rgb(image, pixels))
        return np.asarray(source.resize((width, height), resample=self.resample))

    def resize_array(self, rgb: np.ndarray, height: int, width: int) -> np.ndarray:
        """``resize`` of an (H, W, 3) uint8 array the caller built (e.g. padded)."""
        if self.resize_with_torch:
            return _torch_resize(rgb, height, width, TORCH_FILTERS[self.resample])
        return np.asarray(Image.fromarray(rgb).resize((width, height), resample=self.resample))

    def rescale_normalize(self, src: np.ndarray, channel_shape: tuple[int, ...]) -> np.ndarray:
        """The processor's rescale then normalize of uint8 ``src``, as a new C-contiguous
        float32 array; ``channel_shape`` places the 3 channel values against ``src``."""
        out = np.empty(src.shape, np.float32)
        if self.rescale_divisor is not None:
            np.divide(src, np.float32(self.rescale_divisor), out=out, dtype=np.float32)
        elif self.rescale_factor is not None:  # the float64 product rounded to float32
            np.multiply(src, self.rescale_factor, out=out, dtype=np.float64, casting="same_kind")
        else:
            np.copyto(out, src, casting="unsafe")
        if self.mean is not None and self.std is not None:
            np.subtract(out, np.asarray(self.mean, np.float32).reshape(channel_shape), out=out)
            np.divide(out, np.asarray(self.std, np.float32).reshape(channel_shape), out=out)
        return out


def _torch_resize(rgb: np.ndarray, height: int, width: int, mode: str) -> np.ndarray:
    """(height, width, 3) uint8 (a view, in whatever memory layout torch returns): torch's
    antialiased uint8 resize. Its passes (each rounding to uint8) run horizontal first; where
    PIL starts with the vertical one, so does this."""
    tensor = _as_tensor(rgb).permute(2, 0, 1).unsqueeze(0)  # NCHW view of HWC memory
    if pil_vertical_first(rgb.shape[1], rgb.shape[0], width, height):
        tensor = _interpolate(tensor, height, rgb.shape[1], mode)
    return _interpolate(tensor, height, width, mode)[0].permute(1, 2, 0).numpy()


def _interpolate(tensor: torch.Tensor, height: int, width: int, mode: str) -> torch.Tensor:
    return torch.nn.functional.interpolate(
        tensor, size=(height, width), mode=mode, antialias=True, align_corners=False
    )


def pil_vertical_first(width: int, height: int, new_width: int, new_height: int) -> bool:
    """Whether this Pillow resizes (width, height) -> (new_width, new_height) vertical pass
    first. Pillow >= 13 does when the height shrinks by more than twice what the width does;
    12.2 and 12.3 for images over 100 times taller than wide; older ones never."""
    if _PILLOW >= (13,):
        return 0 < height - new_height and height - new_height > 2 * (width - new_width)
    if _PILLOW >= (12, 2):
        return height > width * 100 and new_height < height
    return False


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A zero-copy tensor of a (possibly read-only) array, only ever read."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    try:
        return torch.from_dlpack(array)  # no copy and, unlike from_numpy, no warning
    except (BufferError, RuntimeError, TypeError):  # older numpy: no read-only DLPack export
        return torch.from_numpy(array.copy())
