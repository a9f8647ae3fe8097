"""Byte-level BPE tokenizer for the tiny presets, trained locally on the built-in corpus.

Conventions (mirroring llava-hf/llava-1.5-7b-hf):

* special tokens ``<unk>`` = 0, ``<s>`` = 1 (bos), ``</s>`` = 2 (eos), ``<pad>`` = 3 and
  ``<image>`` = 4 (the image placeholder); each always encodes as one id, even glued to text.
* ``tokenizer(text)`` prepends ``<s>`` (a ``TemplateProcessing`` post-processor does it, like
  LLaMA's ``add_bos_token=True``); ``tokenizer(text, add_special_tokens=False)`` does not.
* the chat template does NOT emit ``<s>``: rendering then ``tokenizer(prompt)`` gives exactly one
  bos, the same as ``LlavaProcessor(text=prompt)``.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from .corpus import build_corpus

UNK, BOS, EOS, PAD, IMAGE = "<unk>", "<s>", "</s>", "<pad>", "<image>"
SPECIAL_TOKENS: tuple[str, ...] = (UNK, BOS, EOS, PAD, IMAGE)
SPECIAL_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}

# LLaVA-1.5 conversation format. Content is a string or a list of OpenAI-style parts; the
# images of a turn are rendered first ("<image>\n" each), then its text parts joined by " ".
# Renders e.g. "USER: <image>\nWhat is this? ASSISTANT: A cat.</s>USER: Why? ASSISTANT:".
CHAT_TEMPLATE = (
    "{%- set image_types = ['image', 'image_url', 'input_image'] -%}"
    "{%- set text_types = ['text', 'input_text'] -%}"
    "{%- for message in messages -%}"
    "{%- set ns = namespace(images=0, texts=[]) -%}"
    "{%- if message['content'] is string -%}"
    "{%- set ns.texts = [message['content']] -%}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] in image_types -%}{%- set ns.images = ns.images + 1 -%}"
    "{%- elif part['type'] in text_types -%}{%- set ns.texts = ns.texts + [part['text']] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- set text = ns.texts | join(' ') -%}"
    "{%- if message['role'] == 'system' -%}{{- text + ' ' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'ASSISTANT: ' + text + '</s>' -}}"
    "{%- else -%}{{- 'USER: ' + '<image>\\n' * ns.images + text + ' ' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)


def train_bpe(vocab_size: int, corpus: list[str] | None = None) -> Tokenizer:
    """Train a deterministic byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size``."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus if corpus is not None else build_corpus(), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"BPE reached only {tok.get_vocab_size()} tokens, wanted {vocab_size}; "
            "enlarge the built-in corpus"
        )
    for token, idx in SPECIAL_TOKEN_IDS.items():
        assert tok.token_to_id(token) == idx, (token, tok.token_to_id(token))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, SPECIAL_TOKEN_IDS[BOS])],
    )
    return tok


def build_tokenizer(vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """Train the BPE and wrap it as a transformers fast tokenizer with the LLaVA chat template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(vocab_size),
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=model_max_length,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
