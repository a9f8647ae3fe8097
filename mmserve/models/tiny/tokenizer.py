"""Byte-level BPE tokenizers for the tiny presets, trained locally on the built-in corpus.

Two flavours share the training code: ``LLAVA`` and ``QWEN2_VL`` (see ``TokenizerFlavor``).

LLaVA conventions (mirroring llava-hf/llava-1.5-7b-hf):

* special tokens ``<unk>`` = 0, ``<s>`` = 1 (bos), ``</s>`` = 2 (eos), ``<pad>`` = 3 and
  ``<image>`` = 4 (the image placeholder); each always encodes as one id, even glued to text.
* ``tokenizer(text)`` prepends ``<s>`` (a ``TemplateProcessing`` post-processor does it, like
  LLaMA's ``add_bos_token=True``); ``tokenizer(text, add_special_tokens=False)`` does not.
* the chat template does NOT emit ``<s>``: rendering then ``tokenizer(prompt)`` gives exactly one
  bos, the same as ``LlavaProcessor(text=prompt)``.

Qwen2-VL conventions (mirroring Qwen/Qwen2-VL-*-Instruct): ``<|endoftext|>`` = 0 (pad),
``<|im_start|>`` = 1, ``<|im_end|>`` = 2 (eos), ``<|vision_start|>``, ``<|vision_end|>``,
``<|image_pad|>`` (the image placeholder), ``<|video_pad|>``; no bos, no unk.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from .corpus import build_corpus

UNK, BOS, EOS, PAD, IMAGE = "<unk>", "<s>", "</s>", "<pad>", "<image>"
SPECIAL_TOKENS: tuple[str, ...] = (UNK, BOS, EOS, PAD, IMAGE)
SPECIAL_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}

# LLaVA-1.5 conversation format. Content is a string or a list of OpenAI-style parts; the
# images of a turn are rendered first ("<image>\n" each), then its text parts joined by " ".
# Renders e.g. "USER: <image>\nWhat is this? ASSISTANT: A cat.</s>USER: Why? ASSISTANT:".
# Linear in the number of parts: filters, no list rebuilt per part.
# OpenAI-style content part types the templates accept.
PART_TYPES = (
    "{%- set image_types = ['image', 'image_url', 'input_image'] -%}"
    "{%- set text_types = ['text', 'input_text'] -%}"
)
CHAT_TEMPLATE = PART_TYPES + (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}"
    "{%- set images, text = 0, message['content'] -%}"
    "{%- elif message['content'] is not none -%}"
    "{%- set images = message['content'] | selectattr('type', 'in', image_types)"
    " | list | length -%}"
    "{%- set text = message['content'] | selectattr('type', 'in', text_types)"
    " | map(attribute='text') | join(' ') -%}"
    "{%- else -%}{%- set images, text = 0, '' -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{- text + ' ' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'ASSISTANT: ' + text + '</s>' -}}"
    "{%- else -%}{{- 'USER: ' + '<image>\\n' * images + text + ' ' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)


QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN_SPECIAL_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(QWEN_SPECIAL_TOKENS)}

# Qwen2-VL ChatML format (Qwen's template without the default system prompt). Content is a string
# or a list of OpenAI-style parts rendered in order; an image part becomes
# "<|vision_start|><|image_pad|><|vision_end|>", a video part the same with <|video_pad|>; mmserve
# expands each pad to one token per embedding.
QWEN_CHAT_TEMPLATE = PART_TYPES + (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] in image_types -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] in text_types -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class TokenizerFlavor:
    """Special tokens (ids 0.. in order), their roles and the chat template of one model family."""

    special_tokens: tuple[str, ...]
    chat_template: str
    eos: str
    pad: str
    bos: str | None = None  # prepended by ``tokenizer(text)`` when set
    unk: str | None = None


LLAVA = TokenizerFlavor(SPECIAL_TOKENS, CHAT_TEMPLATE, eos=EOS, pad=PAD, bos=BOS, unk=UNK)
QWEN2_VL = TokenizerFlavor(
    QWEN_SPECIAL_TOKENS, QWEN_CHAT_TEMPLATE, eos="<|im_end|>", pad="<|endoftext|>"
)


def train_bpe(
    vocab_size: int, corpus: list[str] | None = None, flavor: TokenizerFlavor = LLAVA
) -> Tokenizer:
    """Train a deterministic byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size``."""
    tok = Tokenizer(models.BPE(unk_token=flavor.unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(flavor.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus if corpus is not None else build_corpus(), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"BPE reached only {tok.get_vocab_size()} tokens, wanted {vocab_size}; "
            "enlarge the built-in corpus"
        )
    for idx, token in enumerate(flavor.special_tokens):
        assert tok.token_to_id(token) == idx, (token, tok.token_to_id(token))
    if flavor.bos is not None:
        bos, bos_id = flavor.bos, flavor.special_tokens.index(flavor.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return tok


def build_tokenizer(
    vocab_size: int, model_max_length: int, flavor: TokenizerFlavor = LLAVA
) -> PreTrainedTokenizerFast:
    """Train the BPE and wrap it as a transformers fast tokenizer with the flavour's template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(vocab_size, flavor=flavor),
        bos_token=flavor.bos,
        eos_token=flavor.eos,
        unk_token=flavor.unk,
        pad_token=flavor.pad,
        model_max_length=model_max_length,
        padding_side="left",
    )
    tokenizer.chat_template = flavor.chat_template
    return tokenizer
