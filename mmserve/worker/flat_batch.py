"""A step's scheduled tokens laid out as one flat varlen batch, with its attention metadata.

Positions are token indices, except for models with ``uses_mrope``: each chunk or decode step
takes its slice of the request's M-RoPE positions (``MRopePositions.slice``).

Attention metadata is built once per step for every layer: block tables, query_start_loc
and seq_lens (what the CPU kernel reads, ``attention_backend == "cpu-kernel"``, which then
takes every row of the step, prefill chunks and decodes, in one call per layer); the torch
fallback derives its gather plan from them on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from mmserve.core.outputs import SchedulerOutput
from mmserve.layers.attention import AttentionMetadata
from mmserve.worker.encoder_runner import EncoderRunner
from mmserve.worker.request_state import RequestState


@dataclass
class FlatBatch:
    token_ids: torch.Tensor
    positions: torch.Tensor  # [T], or [3, T] for M-RoPE models
    meta: AttentionMetadata
    mm_dst: torch.Tensor  # flat indices whose embedding comes from an image
    mm_src: list[torch.Tensor]  # image embedding slices, in mm_dst order
    sample_idx: torch.Tensor
    sample_req_ids: list[str]
    # (req_id, flat row, first position, count): rows whose logits give prompt logprobs
    prompt_rows: list[tuple[str, int, int, int]]


class FlatBatchBuilder:
    """Builds each step's ``FlatBatch``: the requests' scheduled tokens back to back, in
    ``SchedulerOutput.num_scheduled_tokens`` order; a request is sampled only when its chunk
    reaches the end of its known tokens."""

    def __init__(
        self,
        encoder: EncoderRunner,
        device: torch.device,
        block_size: int,
        attention_backend: str,
        uses_mrope: bool,
        bidirectional_images: bool,
    ) -> None:
        self.encoder = encoder
        self.device = device
        self.block_size = block_size
        self.attention_backend = attention_backend
        self.uses_mrope = uses_mrope
        self.bidirectional_images = bidirectional_images

    def build(self, sched: SchedulerOutput, states: Mapping[str, RequestState]) -> FlatBatch:
        ids: list[int] = []
        mrope_positions, tables, query_lens, seq_lens = [], [], [], []
        mm_dst, mm_src = [], []
        # bidirectional-image models only: the image ranges each sequence's queries overlap
        image_ranges: list[list[tuple[int, int]]] | None = [] if self.bidirectional_images else None
        sample_idx, sample_req_ids = [], []
        prompt_rows: list[tuple[str, int, int, int]] = []
        offset = 0
        for req_id, n in sched.num_scheduled_tokens.items():
            state = states[req_id]
            start, end = state.num_computed_tokens, state.num_computed_tokens + n
            ids.extend(state.token_ids[start:end])
            if state.mrope is not None:
                mrope_positions.append(state.mrope.slice(start, end))
            tables.append(state.block_table)
            query_lens.append(n)
            seq_lens.append(end)
            ranges: list[tuple[int, int]] = []
            for item in state.mm_items:
                lo, hi = max(start, item.offset), min(end, item.end)
                if lo < hi:
                    mm_dst.append(torch.arange(lo, hi) - start + offset)
                    mm_src.append(self.encoder.get_slice(item, lo, hi))
                    ranges.append((item.offset, item.end))
            if image_ranges is not None:
                image_ranges.append(ranges)
            if state.params.prompt_logprobs is not None:
                last = min(end, state.num_prompt_tokens - 1)
                if last > start:
                    prompt_rows.append((req_id, offset, start, last - start))
            if end == len(state.token_ids):
                sample_idx.append(offset + n - 1)
                sample_req_ids.append(req_id)
            offset += n
        q_lens, lens = torch.tensor(query_lens), torch.tensor(seq_lens)
        query_start_loc = torch.zeros(len(query_lens) + 1, dtype=torch.long)
        torch.cumsum(q_lens, 0, out=query_start_loc[1:])
        row = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)
        pos = torch.arange(offset) - query_start_loc[row] + (lens - q_lens)[row]
        block_tables = torch.nn.utils.rnn.pad_sequence(tables, batch_first=True)
        bs = self.block_size
        slot_mapping = block_tables[row, pos // bs] * bs + pos % bs
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            query_start_loc=query_start_loc.to(dev, torch.int32),
            seq_lens=lens.to(dev, torch.int32),
            block_tables=block_tables.to(dev, torch.int32),
            block_size=bs,
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
            use_kernel=self.attention_backend == "cpu-kernel",
            use_flex=self.attention_backend == "flex",
            image_ranges=image_ranges,
        )
        positions = torch.cat(mrope_positions, dim=-1) if self.uses_mrope else pos
        return FlatBatch(
            token_ids=torch.tensor(ids, dtype=torch.long, device=dev),
            positions=positions.to(dev),
            meta=meta,
            mm_dst=torch.cat(mm_dst).to(dev) if mm_dst else torch.empty(0, dtype=torch.long),
            mm_src=mm_src,
            sample_idx=torch.tensor(sample_idx, dtype=torch.long, device=dev),
            sample_req_ids=sample_req_ids,
            prompt_rows=prompt_rows,
        )
