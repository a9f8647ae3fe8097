"""A chat about a video through a real single server, on every family that takes videos, with
the preset's own chat template: the answer the offline API gives."""

from __future__ import annotations

import pytest

from tests.support.video_chat import VIDEO_PRESETS, offline_answer, served_answer


@pytest.mark.parametrize("model", VIDEO_PRESETS)
def test_a_video_chat_answers_as_the_offline_api(model: str, serve_model) -> None:
    expected = offline_answer(model)
    with serve_model(model) as server:
        assert served_answer(server.url, model) == expected
