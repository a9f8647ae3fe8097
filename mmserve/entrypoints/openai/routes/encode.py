"""``POST /v1/mm/encode``: encode images and videos ahead of the chat turns that will name them
by handle.

Takes ``{"model", "content": [parts], "cache_salt"?}``, ``content`` exactly a chat message's
content parts (``image_url`` / ``video_url`` with a URL, a data URL or a file under the allowed
path, an image's with an optional ``uuid``; text parts are ignored), and answers ``{"object":
"list", "items": [{"type": "image" | "video", "handle", "tokens"}, ...]}`` in content order.
Everything a chat request's media go through applies (request limits, media policy, limits,
admission checks); only the vision encoder runs (a video's every piece). A later chat part
``{"type": "image_url", "image_url": {"url": "mmserve://<handle>"}}`` (or the ``uuid`` without
data; a video's: ``video_url``) of the same ``cache_salt`` uses it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.entrypoints.chat_utils import chat_to_prompt
from mmserve.entrypoints.openai.completions.protocol import ContentPart
from mmserve.entrypoints.openai.completions.serving import OpenAIServing
from mmserve.entrypoints.openai.http.errors import error_response, to_api_error
from mmserve.multimodal.handles import in_content_order, media_kinds

ReadBody = Callable[[Request, Any], Awaitable[Any]]


class EncodeRequest(BaseModel):
    """The body; any other field is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    content: Annotated[list[ContentPart], Field(min_length=1)]
    cache_salt: Annotated[str, Field(min_length=1)] | None = None


class EncodeHandler:
    """The endpoint over one engine (its template, text pool, admission and engine thread)."""

    def __init__(self, engine: AsyncLLMEngine, serving: OpenAIServing) -> None:
        self.engine = engine
        self.serving = serving

    async def encode(self, req: EncodeRequest) -> dict[str, Any]:
        self.engine.check_health()
        self.serving.check_model(req.model)
        parts = [part.model_dump(exclude_none=True) for part in req.content]
        messages = await self.serving.decode_embeds([{"role": "user", "content": parts}], "content")
        engine = self.engine
        prompt = await engine.run_text(
            chat_to_prompt, engine.tokenizer, messages, req.cache_salt, engine.chat_template
        )
        records = in_content_order(await engine.encode(prompt), media_kinds(parts))
        return {"object": "list", "items": [record.item for record in records]}


def add_encode_route(app: FastAPI, handler: EncodeHandler, body: ReadBody) -> None:
    """``POST /v1/mm/encode``; every failure is an OpenAI-shaped error."""

    @app.post("/v1/mm/encode")
    async def encode(raw: Request) -> Any:
        try:
            return await handler.encode(await body(raw, EncodeRequest))
        except Exception as exc:
            return error_response(to_api_error(exc))
