"""SmolVLM (Idefics3) pieces against transformers: the vision tower's position ids (not always
``arange``), the tower and the pixel-shuffle connector, the image text and its token bound, and
the hub layouts (SmolVLM-256M-Instruct's files; SmolVLM2's architecture, processor classes and
template, greedy-identical to transformers' SmolVLMForConditionalGeneration)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoImageProcessor,
    AutoTokenizer,
    Idefics3Processor,
    Idefics3VisionConfig,
    SmolVLMForConditionalGeneration,
)
from transformers.models.idefics3.modeling_idefics3 import (
    Idefics3Connector as HFConnector,
)
from transformers.models.idefics3.modeling_idefics3 import (
    Idefics3VisionEmbeddings,
    Idefics3VisionTransformer,
)

from mmserve import LLM, SamplingParams
from mmserve.engine.setup.loading import build_model_config
from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.idefics3 import Idefics3Connector
from mmserve.models.tiny import resolve_model_path
from mmserve.models.tiny.presets import randomize_weights
from mmserve.models.vision.idefics3 import Idefics3VisionTower, full_tile_position_ids
from mmserve.multimodal.image.idefics3 import tile_text
from tests.support.images import make_image

GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.mark.parametrize("side", [8, 16, 19, 32, 40])
def test_position_ids_are_transformers_for_a_full_tile(side):
    """19 and 40 patches a side are sides where transformers' grid is not ``arange``."""
    config = Idefics3VisionConfig(hidden_size=8, image_size=side * 2, patch_size=2)
    embeddings = Idefics3VisionEmbeddings(config)
    seen: dict[str, torch.Tensor] = {}
    embeddings.position_embedding.register_forward_pre_hook(
        lambda module, args: seen.setdefault("ids", args[0])
    )
    pixels = torch.zeros(1, 3, side * 2, side * 2)
    embeddings(pixels, torch.ones(1, side, side, dtype=torch.bool))
    assert torch.equal(full_tile_position_ids(side), seen["ids"][0])


def test_tower_and_connector_match_transformers(tmp_path):
    config = Idefics3VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=76,
        patch_size=4,  # 19 patches a side
    )
    torch.manual_seed(0)
    hf = Idefics3VisionTransformer(config).eval()
    randomize_weights(hf)
    hf.save_pretrained(tmp_path)
    tower = Idefics3VisionTower(config).eval()
    load_safetensors(tower, tmp_path, [], skip=tower.skipped_weights(""))
    pixels = torch.randn(3, 3, 76, 76, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(
            tower(pixels), hf(pixels).last_hidden_state, rtol=1e-5, atol=1e-5
        )

    class Full:
        scale_factor = 4
        vision_config = Idefics3VisionConfig(hidden_size=8, image_size=32, patch_size=2)
        text_config = type("Text", (), {"hidden_size": 16})

    ours, theirs = Idefics3Connector(Full), HFConnector(Full)
    theirs.load_state_dict(ours.state_dict())
    feats = torch.randn(2, 256, 8)
    torch.testing.assert_close(ours(feats), theirs(feats), rtol=0, atol=0)


def test_image_text_and_token_bound():
    """``tile_text`` is the processor's expansion; ``max_tokens_per_image`` bounds every image's
    tokenized text (3x3 tiles on the preset) and is attained up to a merged ``\\n\\n``."""
    cfg = build_model_config("tiny-smolvlm")
    tokenizer = AutoTokenizer.from_pretrained(cfg.path)
    processor = Idefics3Processor(
        AutoImageProcessor.from_pretrained(cfg.path), tokenizer, image_seq_len=16
    )
    lengths = []
    for size in [(200, 30), (30, 200), (64, 64), (120, 50), (300, 290), (10, 10)]:
        image = make_image(1, size)
        expanded = processor(text="<image>", images=[image])["input_ids"][0]
        rows = processor.image_processor(images=[image], return_row_col_info=True)
        text = tile_text(rows["rows"][0][0], rows["cols"][0][0], 16)
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == expanded
        lengths.append(len(expanded))
    assert max(lengths) <= cfg.max_tokens_per_image <= max(lengths) + 1
    unsplit = build_model_config("tiny-smolvlm", processor_kwargs={"do_image_splitting": False})
    assert unsplit.max_tokens_per_image == 16 + 3


def test_smolvlm_hub_layout_files():
    path = resolve_model_path("tiny-smolvlm-hub")
    assert (path / "chat_template.json").is_file()
    assert not (path / "chat_template.jinja").exists()
    assert "chat_template" in (path / "tokenizer_config.json").read_text()


def test_smolvlm2_hub_layout_matches_transformers():
    """SmolVLM2's files (``SmolVLMForConditionalGeneration``, ``SmolVLMImageProcessor``): the
    same answers as transformers' SmolVLM model on the processor's prompt (built with
    Idefics3's processor, whose image text SmolVLMProcessor shares: the latter needs
    ``num2words``)."""
    model = "tiny-smolvlm2-hub"
    path = resolve_model_path(model)
    processor = Idefics3Processor(
        AutoImageProcessor.from_pretrained(path),
        AutoTokenizer.from_pretrained(path),
        image_seq_len=16,
    )
    hf = SmolVLMForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(model, seed=0)
    assert llm.engine.config.model.architecture == "SmolVLMForConditionalGeneration"
    prompt = "<|im_start|>User:<image>What is this?<end_of_utterance>\nAssistant:"
    image = make_image(5, (120, 50))
    inputs = processor(text=prompt, images=[image], return_tensors="pt")
    with torch.inference_mode():
        want = hf.generate(**inputs, max_new_tokens=16, do_sample=False)
    out = llm.generate([{"prompt": prompt, "images": [image]}], GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == want[0, inputs["input_ids"].shape[1] :].tolist()
    chat = llm.chat(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ],
        GREEDY,
        use_tqdm=False,
    )[0]
    assert chat.prompt_token_ids == inputs["input_ids"][0].tolist()
