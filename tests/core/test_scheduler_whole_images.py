"""Models whose image tokens attend to each other (Gemma 3) run with
``disable_chunked_mm_input``: no prefill chunk ends inside an image, including a chunk that
starts inside one after a prefix hit."""

from __future__ import annotations

from mmserve.request import RequestStatus
from tests.support.scheduler import fake_step, make_request, make_scheduler, run_to_completion


def test_no_chunk_ends_inside_an_image():
    sched = make_scheduler(budget=20, block_size=4, disable_chunked_mm_input=True)
    requests = [
        make_request("a", [3, ("x", 16), 5, ("y", 12), 30]),
        make_request("b", [19, ("z", 20), 1]),
        make_request("c", [("x", 16), ("w", 16), 4]),
    ]
    for request in requests:
        sched.add_request(request)
    by_id = {r.req_id: r for r in requests}
    steps = 0
    while sched.has_unfinished_requests():
        out = fake_step(sched)
        steps += 1
        for req_id, n in out.num_scheduled_tokens.items():
            end = by_id[req_id].num_computed_tokens  # where this step's chunk ended
            for item in by_id[req_id].mm_items:
                assert not item.offset < end < item.end, (req_id, n, item)
        assert steps < 100


def test_prefix_hit_inside_an_image_waits_for_room_for_the_rest():
    sched = make_scheduler(budget=45, block_size=16, disable_chunked_mm_input=True)
    sched.add_request(make_request("r1", [("a", 40), 2]))
    run_to_completion(sched)  # a's KV blocks stay cached
    sched.add_request(make_request("text", [44]))
    r2 = make_request("r2", [("a", 40), 5])
    sched.add_request(r2)
    out = fake_step(sched)
    # r2's hit (32 tokens) ends inside image a; 1 token of budget is left: r2 waits rather
    # than computing image tokens apart from the rest of their image
    assert out.num_scheduled_tokens == {"text": 44}
    assert r2.status == RequestStatus.WAITING
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"text": 1, "r2": 13}
    assert r2.num_cached_tokens == 32
