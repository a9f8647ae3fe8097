"""Admission: content hashes, uuid override, placeholder ranges, the preprocessing memo."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from mmserve import LLM
from mmserve.inputs import PromptInput
from mmserve.multimodal.hashing import hash_image, hash_uuid
from mmserve.multimodal.image.memo import PreparedImage, ProcessedImageMemo

PROMPT = "USER: <image>\nA <image>\nB ASSISTANT:"


@pytest.fixture(scope="module")
def engine():
    return LLM("tiny-llava").engine


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_hash_covers_pixels_mode_size_model_and_kwargs(images):
    img = images[0]
    base = hash_image(img, "m", {})
    assert len(base) == 64  # 256-bit hex
    assert hash_image(img.copy(), "m", {}) == base
    assert hash_image(img, "other-model", {}) != base
    assert hash_image(img, "m", {"max_pixels": 10}) != base
    assert hash_image(img.convert("RGBA"), "m", {}) != base
    flipped = Image.fromarray(np.asarray(img)[::-1].copy())
    assert hash_image(flipped, "m", {}) != base
    transposed = Image.frombytes("RGB", img.size[::-1], img.tobytes())  # same bytes, other size
    assert hash_image(transposed, "m", {}) != base
    assert hash_uuid("id-1", "m", {}, 9) != hash_uuid("id-2", "m", {}, 9)
    assert hash_uuid("id-1", "m", {}, 9) != hash_uuid("id-1", "m", {}, 10)
    with pytest.raises(ValueError, match="uuid"):
        hash_uuid("", "m", {}, 9)


def test_items_carry_hash_offset_length_and_same_pixels_share_a_hash(engine, images):
    processed = engine.intake.process(PromptInput(PROMPT, [images[0], png(images[0])]))
    first, second = processed.mm_items
    assert first.hash == second.hash  # PIL and PNG bytes of the same pixels
    assert (first.length, second.length) == (256, 256)
    ids = processed.prompt_token_ids
    image_id = engine.config.model.image_token_id
    for item in processed.mm_items:
        assert ids[item.offset : item.end] == [image_id] * 256
    assert second.offset > first.end


def test_uuid_replaces_the_content_hash(engine, images):
    other_pixels = images[0].transpose(0)  # same size, other pixels
    a = engine.intake.process(
        PromptInput(PROMPT, [images[0], other_pixels], uuids=["same", "same"])
    )
    assert a.mm_items[0].hash == a.mm_items[1].hash
    sizes = engine.intake.process(
        PromptInput(PROMPT, [images[0], images[1]], uuids=["same", "same"])
    )
    assert sizes.mm_items[0].hash != sizes.mm_items[1].hash  # a uuid is checked against size
    salted = engine.intake.process(
        PromptInput(PROMPT, [images[0], images[0]], uuids=["same", "same"], cache_salt="tenant")
    )
    assert salted.mm_items[0].hash == salted.mm_items[1].hash != a.mm_items[0].hash
    b = engine.intake.process(PromptInput(PROMPT, [images[0], images[1]], uuids=[None, "x"]))
    assert b.mm_items[0].hash == hash_image(images[0], "tiny-llava", {})


def test_same_bytes_are_decoded_and_preprocessed_once(engine, images):
    data = png(images[2])
    hits = engine.processor.memo.hits
    first = engine.intake.process(PromptInput(PROMPT, [data, data]))
    again = engine.intake.process(PromptInput(PROMPT, [data, data]))
    assert engine.processor.memo.hits == hits + 3
    assert first.mm_items[0].data is again.mm_items[0].data
    assert first.mm_items[0].hash == again.mm_items[1].hash


def test_memo_is_bounded_by_bytes():
    memo = ProcessedImageMemo(max_bytes=3 * 4000)
    for i in range(5):
        memo.put(str(i), PreparedImage(str(i), np.zeros(1000, np.float32), 1))
    assert memo.get("0") is None and memo.get("1") is None
    assert memo.get("4") is not None
    memo.put("huge", PreparedImage("h", np.zeros(10_000, np.float32), 1))
    assert memo.get("huge") is None


def test_a_pil_image_is_hashed_and_copied_once_per_preparation(engine, monkeypatch):
    """The memo's key of a PIL image is its content hash; preparing it on a miss takes that
    hash and those pixels, not a second ``tobytes`` and blake3 of the same pixels."""
    from mmserve.multimodal.image import prep

    hashes: list[str] = []
    copies: list[bool] = []
    real_hash, real_tobytes = prep.hash_image, Image.Image.tobytes

    def counting_hash(*args, **kwargs):
        hashes.append(real_hash(*args, **kwargs))
        return hashes[-1]

    def counting_tobytes(self, *args, **kwargs):
        copies.append(self is image)  # not the resized copy numpy reads
        return real_tobytes(self, *args, **kwargs)

    image = Image.fromarray(np.random.default_rng(7).integers(0, 255, (40, 50, 3), np.uint8))
    expected = real_hash(image, *_hash_settings(engine))
    monkeypatch.setattr(prep, "hash_image", counting_hash)
    monkeypatch.setattr(Image.Image, "tobytes", counting_tobytes)
    prepared = engine.processor.prepare_image(image)
    assert len(hashes) == 1 and sum(copies) == 1
    assert prepared.mm_hash == hashes[0] == expected
    engine.processor.prepare_image(image)  # a memo hit: hashed again to find it, no more
    assert len(hashes) == 2 and sum(copies) == 2


def _hash_settings(engine):
    from mmserve.multimodal.sampling_keys import without_sampling

    mc = engine.processor.model_config
    return mc.model, without_sampling(mc.processor_kwargs)
