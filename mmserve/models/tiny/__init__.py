"""Built-in tiny random-weight LLaVA and Qwen2-VL checkpoints ("presets"), built locally with no
hub access."""

from .cache import default_cache_dir, ensure_layout, resolve_model_path
from .families.qwen2_5_vl import Qwen2_5_VLPresetSpec
from .families.qwen2_vl import Qwen2VLPresetSpec
from .families.qwen3_vl import Qwen3VLPresetSpec
from .hub_layouts import HUB_LAYOUTS, LAYOUT_NAMES
from .presets import (
    BUILD_VERSION,
    PRESET_NAMES,
    PRESETS,
    PresetSpec,
    build_model,
    build_preset,
    count_parameters,
    make_config,
)
from .tokenizer import (
    CHAT_TEMPLATE,
    QWEN_CHAT_TEMPLATE,
    QWEN_SPECIAL_TOKEN_IDS,
    SPECIAL_TOKEN_IDS,
    build_tokenizer,
)

__all__ = [
    "BUILD_VERSION",
    "CHAT_TEMPLATE",
    "HUB_LAYOUTS",
    "LAYOUT_NAMES",
    "PRESETS",
    "PRESET_NAMES",
    "SPECIAL_TOKEN_IDS",
    "PresetSpec",
    "QWEN_CHAT_TEMPLATE",
    "QWEN_SPECIAL_TOKEN_IDS",
    "Qwen2VLPresetSpec",
    "Qwen2_5_VLPresetSpec",
    "Qwen3VLPresetSpec",
    "build_model",
    "build_preset",
    "build_tokenizer",
    "count_parameters",
    "default_cache_dir",
    "ensure_layout",
    "make_config",
    "resolve_model_path",
]
