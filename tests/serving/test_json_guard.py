"""``JSONGuard``: how many large bodies may wait for the screening helper, and who decides."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from mmserve.cli import build_parser
from mmserve.entrypoints.openai.http import json_guard
from mmserve.entrypoints.openai.http.json_guard import GuardBusy, JSONGuard
from mmserve.entrypoints.openai.http.limits import RequestLimits
from mmserve.entrypoints.openai.server import build_app_from_args

BODY = b'{"model": "m", "messages": []}'


def test_bodies_beyond_max_waiting_get_guard_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def slow_screen(body: bytes, limits: Any) -> tuple[str, Any, Any]:
        release.wait(10)
        return "ok", {"n": len(body)}, None

    monkeypatch.setattr(json_guard, "_screen", slow_screen)
    guard = JSONGuard(RequestLimits(), max_waiting=20)
    guard._pool = ThreadPoolExecutor(20)  # type: ignore[assignment]  # same code path, no spawn

    async def burst() -> list[Any]:
        waiting = [asyncio.create_task(guard.parse(BODY)) for _ in range(20)]
        await asyncio.sleep(0.05)
        with pytest.raises(GuardBusy):
            await guard.parse(BODY)  # the 21st while 20 wait
        release.set()
        return await asyncio.gather(*waiting)

    assert len(asyncio.run(burst())) == 20  # 16 used to be the fixed limit
    assert guard._waiting == 0
    guard.shutdown()


def test_max_waiting_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_waiting must be >= 1, got 0"):
        JSONGuard(RequestLimits(), max_waiting=0)


@pytest.mark.parametrize("queued", [40, 0])
def test_server_sizes_the_guard_from_max_queued_requests(queued: int) -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "tiny-llava", "--max-queued-requests", str(queued)]
    )
    app = build_app_from_args(args)
    assert app.state.json_guard.max_waiting == max(1, queued)


def test_shutdown_returns_once_the_helper_and_the_pool_thread_ended() -> None:
    guard = JSONGuard(RequestLimits(), max_waiting=1)
    assert asyncio.run(guard.parse(BODY)) == {"model": "m", "messages": []}
    assert multiprocessing.active_children()
    guard.shutdown()
    assert multiprocessing.active_children() == []
    assert not [t for t in threading.enumerate() if type(t).__name__ == "_ExecutorManagerThread"]
