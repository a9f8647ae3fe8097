"""The last step of every video processor: rescale and normalize resized uint8 frames in one
pass, as transformers' fused ``rescale_and_normalize`` does (mean and std divided by the rescale
factor, so the uint8 values are normalized directly)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def rescale_and_normalize(
    video: torch.Tensor,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    scale: float | None,
) -> np.ndarray:
    """``[T, 3, h, w]`` uint8 frames -> float32 ``pixel_values`` of one video."""
    if mean is not None and std is not None:
        mean_t, std_t = torch.tensor(mean), torch.tensor(std)
        if scale is not None:
            mean_t, std_t = mean_t * (1.0 / scale), std_t * (1.0 / scale)
        values = video.to(torch.float32).sub_(mean_t.view(-1, 1, 1)).div_(std_t.view(-1, 1, 1))
    elif scale is not None:
        values = video * scale
    else:
        values = video.to(torch.float32)
    return values.numpy()
