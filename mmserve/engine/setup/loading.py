"""Resolve a model name/path and load its config, tokenizer, image processor and weights."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer

from mmserve.config import EngineConfig, ModelConfig, checkpoint_dtype
from mmserve.engine.setup.chat_template import find_chat_template
from mmserve.engine.setup.device import resolve_device
from mmserve.engine.setup.dtype import choose_dtype, log_dtype_choice
from mmserve.engine.setup.generation_defaults import load_generation_defaults
from mmserve.engine_args import EngineArgs
from mmserve.graph_config import DecodeGraphConfig
from mmserve.layers.linear import (
    onednn_half_dtypes,
    use_bf16_dot_weights,
    use_bf16_weights,
    use_packed_float32,
    use_packed_half,
    use_small_batch_kernel,
)
from mmserve.layers.rotary import RotaryEmbedding
from mmserve.models.checkpoint.loader import materialize
from mmserve.models.checkpoint.safetensors_file import release_mapped_pages
from mmserve.models.interface import VisionLanguageModel
from mmserve.models.registry import resolve_architecture
from mmserve.models.tiny import resolve_model_path

logger = logging.getLogger(__name__)

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def build_model_config(
    model: str,
    dtype: str = "float32",
    max_model_len: int | None = None,
    processor_kwargs: dict[str, Any] | None = None,
    chat_template: str | None = None,
    generation_config: str = "auto",
    device: str = "cpu",
    revision: str | None = None,
    download_dir: str | None = None,
) -> ModelConfig:
    """``chat_template`` / ``generation_config``: the ``--chat-template`` and
    ``--generation-config`` settings, resolved here (a bad path fails at start-up);
    ``revision`` / ``download_dir``: where a hub model ID is downloaded from and to."""
    path = resolve_model_path(model, revision, download_dir)
    hf_config = AutoConfig.from_pretrained(path)
    choice = choose_dtype(dtype, checkpoint_dtype(hf_config), device)
    log_dtype_choice(choice)
    dtype = choice.dtype
    arch, model_cls = resolve_architecture(hf_config)
    text = getattr(hf_config, "text_config", hf_config)
    limit = text.max_position_embeddings
    if max_model_len is not None and not 1 < max_model_len <= limit:
        raise ValueError(f"max_model_len must be in [2, {limit}], got {max_model_len}")
    eos = _eos_token_ids(path, text)
    kwargs = dict(processor_kwargs or {})
    template, template_source = find_chat_template(path, chat_template)
    return ModelConfig(
        model=model,
        path=path,
        architecture=arch,
        hf_config=hf_config,
        dtype=dtype,
        max_model_len=max_model_len or limit,
        hidden_size=text.hidden_size,
        embedding_width=model_cls.embedding_width(hf_config),
        image_token_id=getattr(hf_config, "image_token_id", None),
        eos_token_ids=eos,
        max_tokens_per_image=model_cls.max_tokens_per_image(hf_config, kwargs),
        max_tokens_per_video_group=model_cls.max_tokens_per_video_group(hf_config, kwargs),
        processor_kwargs=kwargs,
        chat_template=template,
        chat_template_source=template_source,
        generation_defaults=load_generation_defaults(generation_config, path),
    )


def create_engine_config(args: EngineArgs) -> EngineConfig:
    """Validate ``args`` once into frozen configs (reads the checkpoint's config, not weights);
    ``--device auto`` is resolved here."""
    device = resolve_device(args.device)
    model_config = build_model_config(
        args.model,
        args.dtype,
        args.max_model_len,
        args.processor_kwargs,
        args.chat_template,
        args.generation_config,
        device=device,
        revision=args.revision,
        download_dir=args.download_dir,
    )
    scheduler_config = args.scheduler_config()
    _, model_cls = resolve_architecture(model_config.hf_config)
    if model_cls.image_attention == "bidirectional":
        # an image's tokens attend to each other: a chunk may never end inside one
        scheduler_config = dataclasses.replace(scheduler_config, disable_chunked_mm_input=True)
    cache_config = args.cache_config()
    graphs = DecodeGraphConfig.resolve(
        args.enforce_eager,
        args.cuda_graph_sizes,
        args.max_seq_len_to_capture,
        device,
        max_num_seqs=scheduler_config.max_num_seqs,
        max_model_len=model_config.max_model_len,
        block_size=cache_config.block_size,
    )
    return EngineConfig(
        model_config,
        cache_config,
        scheduler_config,
        args.seed,
        args.attention_backend,
        device,
        args.gpu_memory_utilization or 0.9,
        args.encoder_store_config(),
        graphs,
    )


def _eos_token_ids(path: Path, text_config: Any) -> tuple[int, ...]:
    """Every eos id of the text config and generation_config.json (chat models list several)."""
    ids: list[int] = []
    sources = [getattr(text_config, "eos_token_id", None)]
    gen_file = path / "generation_config.json"
    if gen_file.exists():
        sources.append(json.loads(gen_file.read_text()).get("eos_token_id"))
    for value in sources:
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return tuple(ids)


def load_tokenizer(path: Path) -> Any:
    return AutoTokenizer.from_pretrained(path)


def load_image_processor(path: Path, processor_kwargs: dict[str, Any]) -> Any:
    """The PIL flavour of the checkpoint's image processor (the torchvision one does not import
    beside a CPU-only torch)."""
    config_file = path / "preprocessor_config.json"
    if not config_file.exists():
        return None
    name = json.loads(config_file.read_text()).get("image_processor_type", "")
    base = name.removesuffix("Fast").removesuffix("Pil")
    cls = getattr(transformers, base + "Pil", None) or getattr(transformers, base, None)
    if cls is None:
        raise ValueError(f"unknown image processor {name!r} in {config_file}")
    return cls.from_pretrained(path, **processor_kwargs)


def load_model(model_config: ModelConfig, device: torch.device) -> VisionLanguageModel:
    _, model_cls = resolve_architecture(model_config.hf_config)
    with torch.device("meta"):
        module = cast(torch.nn.Module, model_cls(model_config.hf_config))  # type: ignore[call-arg]
    materialize(module, device, torch_dtype(model_config.dtype))  # once, in dtype, on device
    _reinit_buffers(module, device)
    model = cast(VisionLanguageModel, module)
    model.load_weights(model_config.path)
    model.eval()
    # A packed layer's weight mapped from the checkpoint gives its pages back as it is dropped,
    # or they would stay resident beside the packed copy.
    release = release_mapped_pages
    dot = use_bf16_dot_weights(module, release)  # bfloat16 on AVX-512 BF16 without AMX
    packed_half = use_packed_half(module, onednn_half_dtypes(), release)  # other native half
    use_small_batch_kernel(module)  # other decode-sized half-precision matmuls on CPU
    if dot or packed_half:
        logger.info(
            "half-precision linear layers: %d on the bfloat16 dot-product kernel, %d on"
            " oneDNN-packed weights",
            dot,
            packed_half,
        )
    kept = use_bf16_weights(module, release)  # float32 weights holding bfloat16 values
    packed = use_packed_float32(module, release)  # other float32 weights on CPU: oneDNN
    if kept or packed:
        logger.info(
            "float32 linear layers: %d keep their bfloat16 values as bfloat16 (float32"
            " arithmetic), %d on oneDNN-packed float32 weights",
            kept,
            packed,
        )
    return model


def _reinit_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Non-persistent buffers are not in the checkpoint: rebuild them on the real device."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.inv_freq = module.inverse_frequencies(device)
