"""The scheduler's live requests: where each one waits or runs, and how one ends."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.core.kv_cache_manager import KVCacheManager
from mmserve.core.worker_view import WorkerView
from mmserve.request import Request, RequestStatus


class RequestQueues:
    """The live requests by id and the two queues they stand in (``Scheduler``'s base).

    Invariants: a request is live (in ``requests``) from ``add_request`` until it ends, and a
    live request is in exactly one of ``waiting`` and ``running`` (``Scheduler`` orders both);
    ending one (``_finish``) takes it out of its queue and ``requests``, frees its KV blocks
    and encoder-cache references, tells the worker view (``WorkerView.ended``), sets its final
    status and then tells ``on_finish``.
    """

    def __init__(self, kv_manager: KVCacheManager, encoder_cache: EncoderCacheManager) -> None:
        self.kv = kv_manager
        self.encoder_cache = encoder_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.worker = WorkerView()
        self.on_finish: Callable[[Request], None] | None = None  # told of each request's end

    def add_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in use")
        self.requests[request.req_id] = request
        self.kv.update_block_hashes(request)
        self.waiting.append(request)

    def finish_requests(self, req_ids: list[str], status: RequestStatus) -> None:
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is not None:
                self._finish(request, status)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def head(self) -> Request | None:
        """The request the scheduler serves first: the oldest running, else the next waiting."""
        if self.running:
            return self.running[0]
        return self.waiting[0] if self.waiting else None

    def _release_resources(self, request: Request) -> None:
        self.kv.free(request)
        self.encoder_cache.release_all(request.req_id, [item.key for item in request.mm_items])

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._release_resources(request)
        self.worker.ended(request.req_id)
        request.status = status
        del self.requests[request.req_id]
        if self.on_finish is not None:
            self.on_finish(request)
