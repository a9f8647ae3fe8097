"""Real-size shape presets: published hub configs of real VLMs with random weights.

``shape:<hub repository name>`` (e.g. ``shape:Qwen2-VL-2B-Instruct``) names each; they are
built on demand into the model cache like the tiny presets, but are gigabytes, so no default
test builds one whole (see ``build.py``).
"""

from .build import (
    SHAPE_BUILD_VERSION,
    SHAPE_NAMES,
    SHAPES,
    build_shape,
    build_spec,
    count_shape_parameters,
    get_shape,
    meta_model,
    tensor_plans,
)
from .spec import ShapeSpec, TokenLayout

__all__ = [
    "SHAPES",
    "SHAPE_BUILD_VERSION",
    "SHAPE_NAMES",
    "ShapeSpec",
    "TokenLayout",
    "build_shape",
    "build_spec",
    "count_shape_parameters",
    "get_shape",
    "meta_model",
    "tensor_plans",
]
