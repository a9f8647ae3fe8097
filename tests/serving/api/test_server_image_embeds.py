"""``image_embeds`` content parts through a real server (vLLM's request shape): with
``--enable-mm-embeds`` the encoder's own output, sent as a base64 ``torch.save``d tensor
(Qwen-VL: with its grid), answers as the image does and encodes nothing; a pickle
``weights_only`` refuses, a sparse or nested tensor, an expanded view, a wrong shape, bad
base64, a uuid or an encode are 400s, an oversize value a 413, and the server keeps serving
after each. Without the flag any such part is a 400 (``mm_embeds_disabled``) on chat,
``/tokenize`` and ``/v1/mm/encode``."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import pytest
import torch

from mmserve.entrypoints.openai.server import RunningServer
from mmserve.multimodal.media.limits import MAX_IMAGE_BYTES
from tests.support.server import image_messages

CHAT, ENCODE, TOKENIZE = "/v1/chat/completions", "/v1/mm/encode", "/tokenize"
QUESTION = {"type": "text", "text": "What is in the picture?"}


def saved(value: object) -> str:
    buf = io.BytesIO()
    torch.save(value, buf)
    return base64.b64encode(buf.getvalue()).decode()


def image_part(seed: int) -> dict:
    return image_messages(seed, (64, 48))[0]["content"][0]


def encoder_output(server: RunningServer, http: httpx.Client, model: str) -> tuple:
    """What the server's vision encoder makes of ``image_part(1)``, and its Qwen-VL grid."""
    body = {"model": model, "content": [image_part(1)], "cache_salt": "encoder"}
    [item] = http.post(ENCODE, json=body).json()["items"]
    engine = server.engine.engine
    embedding = engine._host_embedding(f"{item['handle']}:{item['tokens']}")
    assert embedding is not None
    data = engine.handles.kept._local[item["handle"]].image.data
    grid = data.get("image_grid_thw") if isinstance(data, dict) else None
    return embedding.clone(), None if grid is None else torch.as_tensor(grid).reshape(1, 3)


def embeds_part(value: str, grid: torch.Tensor | None) -> dict:
    if grid is None:
        return {"type": "image_embeds", "image_embeds": value}
    return {"type": "image_embeds", "image_embeds": {"image_embeds": value,
                                                     "image_grid_thw": saved(grid)}}  # fmt: skip


def chat(model: str, part: dict, **extra) -> dict:
    messages = [{"role": "user", "content": [part, QUESTION]}]
    return {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


def encoded(server: RunningServer) -> float:
    return server.engine.get_metrics()["encoder_images_encoded"]


def error_of(resp: httpx.Response, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


@pytest.fixture(scope="module", params=["tiny-llava", "tiny-qwen2-vl"])
def served(request, serve_model) -> Iterator[tuple[str, RunningServer, httpx.Client]]:
    flags = ["--enable-mm-embeds", "--skip-server-warmup"]
    with serve_model(request.param, *flags) as srv:
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            yield request.param, srv, client


def test_embeds_part_answers_as_the_image_and_encodes_nothing(served):
    model, server, http = served
    emb, grid = encoder_output(server, http, model)
    sent = http.post(CHAT, json=chat(model, image_part(1), cache_salt="pixels")).json()
    before = encoded(server)
    resp = http.post(CHAT, json=chat(model, embeds_part(saved(emb), grid)))
    assert resp.status_code == 200, resp.text
    assert encoded(server) == before
    given = resp.json()
    assert given["choices"][0]["message"] == sent["choices"][0]["message"]
    assert given["usage"]["prompt_tokens"] == sent["usage"]["prompt_tokens"]
    # the same tensor again: keyed by its content, the prefix cache hits
    again = http.post(CHAT, json=chat(model, embeds_part(saved(emb.clone()), grid))).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert encoded(server) == before
    # /tokenize counts the embeddings' placeholders as the image's
    msgs = chat(model, embeds_part(saved(emb), grid))["messages"]
    count = http.post(TOKENIZE, json={"model": model, "messages": msgs}).json()["count"]
    assert count == sent["usage"]["prompt_tokens"]


class Boom:
    def __reduce__(self):
        return (print, ("unpickled!",))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_bad_payloads_are_refused_and_the_server_keeps_serving(served, capfd):
    model, server, http = served
    emb, grid = encoder_output(server, http, model)
    rows, width = emb.shape
    nested = torch.nested.nested_tensor([emb, emb[:-1]])
    bad = [
        (saved(emb.to_sparse()), "dense"),
        (saved(nested), "dense"),
        (saved(Boom()), "weights_only"),
        (saved({"rows": 3}), "torch.Tensor"),
        (saved(torch.zeros(1, width).expand(10**7, width)), "at most"),  # tiny on the wire
        (saved(torch.zeros(rows, width + 3)), f"({rows}, {width + 3})"),
        (saved(emb[:-1]), "rows"),
        (saved(emb.long()), "floating"),
        (saved(torch.full((rows, width), float("nan"))), "finite"),
        ("%%%", "base64"),
    ]
    for value, message in bad:
        err = error_of(http.post(CHAT, json=chat(model, embeds_part(value, grid))))
        assert message in err["message"], err
        assert "Traceback" not in err["message"] and "0x" not in err["message"]
    assert "unpickled!" not in capfd.readouterr().out
    if grid is not None:
        part = {"type": "image_embeds", "image_embeds": {"image_embeds": saved(emb)}}
        assert "image_grid_thw" in error_of(http.post(CHAT, json=chat(model, part)))["message"]
        part["image_embeds"]["image_grid_thw"] = [[1, 2, 2]]  # a JSON list is vLLM's too
        assert "image_grid_thw" in error_of(http.post(CHAT, json=chat(model, part)))["message"]
    with_uuid = {**embeds_part(saved(emb), grid), "uuid": "mine"}
    assert "uuid" in error_of(http.post(CHAT, json=chat(model, with_uuid)))["message"]
    encode = {"model": model, "content": [embeds_part(saved(emb), grid)]}
    assert "send them with the chat" in error_of(http.post(ENCODE, json=encode))["message"]
    huge = "A" * (4 * -(-MAX_IMAGE_BYTES // 3) + 4)  # refused on its length, before decoding
    err = error_of(http.post(CHAT, json=chat(model, embeds_part(huge, grid))), 413)
    assert err["code"] == "image_too_large"
    ok = http.post(CHAT, json=chat(model, embeds_part(saved(emb), grid)))
    assert ok.status_code == 200, ok.text


@pytest.fixture(scope="module")
def without_flag(serve_model) -> Iterator[httpx.Client]:
    with serve_model("tiny-llava", "--skip-server-warmup") as srv:
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            yield client


def test_without_the_flag_embeds_parts_are_refused(without_flag):
    part = {"type": "image_embeds", "image_embeds": saved(torch.zeros(4, 8))}
    for path, body in [
        (CHAT, chat("tiny-llava", part)),
        (TOKENIZE, {"model": "tiny-llava", "messages": [{"role": "user", "content": [part]}]}),
        (ENCODE, {"model": "tiny-llava", "content": [part]}),
    ]:
        err = error_of(without_flag.post(path, json=body))
        assert "--enable-mm-embeds" in err["message"]
        assert err["code"] == "mm_embeds_disabled"
    resp = without_flag.post(CHAT, json=chat("tiny-llava", image_part(2)))
    assert resp.status_code == 200, resp.text
