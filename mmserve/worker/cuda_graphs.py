"""Decode steps at fixed shapes: static input buffers, one CUDA graph per (batch, context)
bucket, replayed after the step's rows are copied in (vLLM's and SGLang's shape: capture per
batch-size bucket, pad the batch up to it). Off CUDA the same function runs on the same
buffers without capture, which is what the CPU tests check."""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any

import torch

from mmserve.graph_config import DecodeGraphConfig
from mmserve.layers.attention import AttentionMetadata, PagedKVCache
from mmserve.layers.attention_static import StaticDecodePlan
from mmserve.models.interface import VisionLanguageModel
from mmserve.worker.decode_rows import DecodeRows

PAD_TOKEN = 0
CHECK_TOKEN, CHECK_POSITION = 1, 3  # the capture check's input (any token, any position)
CHECK_TOLERANCE = 0.05  # relative error of a replay against eager: rounding, not stale inputs


class DecodeGraphs:
    """The fixed-shape decode forward of one model over one KV cache, per bucket.

    Invariants:

    - ``rows`` [max_batch, 2 + P + W] long holds every bucket's inputs, one row per sequence:
      token, length after it, position(s) (P = 1, or 3 for M-RoPE), block table (W =
      max_context / block_size columns). Bucket (b, c) reads ``rows[:b]`` and the first
      c / block_size table columns and writes ``hidden[:b]``; a graph touches those
      addresses, the weights, the KV cache and its pool only, so a replay sees the rows
      copied in just before it.
    - Rows past a step's requests are padding: token 0, length 1, position 0, a table of the
      pad block (a block the scheduler never hands out). They write the pad block's first
      slot and read only it: never a real block. A real row's table columns past its own
      blocks name the pad block and lie past its length (masked), and rows are independent,
      so padding never changes a real row.
    - CUDA (``capture``): every bucket is captured at start-up, before any request, largest
      first into one shared pool (``hidden`` and ``rows`` live outside it, so no graph's
      output outlives its replay), and each is checked once against an eager run.
    - ``enabled`` False sends every step back to the eager path.
    """

    def __init__(
        self,
        model: VisionLanguageModel,
        cache: PagedKVCache,
        config: DecodeGraphConfig,
        pad_block: int,
        device: torch.device,
    ) -> None:
        self.model, self.cache, self.config = model, cache, config
        self.pad_block, self.device = pad_block, device
        self.block_size = config.block_size
        self.num_positions = 3 if model.uses_mrope else 1
        self.table_col = 2 + self.num_positions
        width = config.max_context // config.block_size
        self.rows = torch.empty(
            config.max_batch, self.table_col + width, dtype=torch.long, device=device
        )
        with torch.inference_mode():  # the hidden width and dtype, from one embedding row
            row = model.embed(torch.zeros(1, dtype=torch.long, device=device))
        self.hidden = torch.empty(config.max_batch, row.shape[-1], dtype=row.dtype, device=device)
        self._query_start = torch.arange(config.max_batch + 1, dtype=torch.int32, device=device)
        self._graphs: dict[tuple[int, int], Any] = {}
        self.enabled = True
        self.steps = 0  # decode steps run here
        self.capture_seconds = 0.0
        self._pad_rows()

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def run(self, rows: DecodeRows) -> torch.Tensor:
        """The last hidden state of each row, [B, hidden]: a view of ``hidden``, valid until
        the next step."""
        count = len(rows.req_ids)
        key = self.config.bucket(count, max(rows.seq_lens))
        self._load(rows, *key)
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            self._forward(*key)
        self.steps += 1
        return self.hidden[:count]

    def run_largest(self) -> None:
        """One eager run of the largest bucket, all padding (the memory profile's pass)."""
        self._forward(self.config.max_batch, self.config.max_context)

    def capture(self) -> None:
        """Capture every bucket (CUDA), largest first into one pool: each after one eager
        warm-up run (lazy initialisation and kernel choice stay outside the capture), each
        checked once against an eager run. Raises on any failure."""
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        keys = itertools.product(self.config.batch_sizes, self.config.context_sizes)
        with torch.inference_mode():
            for key in sorted(keys, key=lambda k: (k[0] * k[1], k), reverse=True):
                self._forward(*key)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self._forward(*key)
                self._graphs[key] = graph
                self._check(key)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - started

    def release(self) -> None:
        """Drop the graphs (and so their pool)."""
        self._graphs.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _check(self, key: tuple[int, int]) -> None:
        """A replay equals an eager run of the same rows (same token and position in every
        row: equal k/v, so which row writes the pad slot last does not matter), and it reads
        the rows given after capture, not those captured."""
        count, context = key
        self.rows[:count, 0] = CHECK_TOKEN
        self.rows[:count, 2 : self.table_col] = CHECK_POSITION
        self._forward(count, context)
        expected = self.hidden[:count].clone()
        self.hidden[:count].zero_()
        self._graphs[key].replay()
        got = self.hidden[:count].float()
        self._pad_rows()
        error = ((got - expected.float()).norm() / expected.float().norm().clamp(min=1e-6)).item()
        if not error < CHECK_TOLERANCE:  # NaN fails too
            raise RuntimeError(f"graph {key} replays differently from eager (rel. error {error})")

    def _pad_rows(self) -> None:
        self.rows[:, 0] = PAD_TOKEN
        self.rows[:, 1] = 1
        self.rows[:, 2 : self.table_col] = 0
        self.rows[:, self.table_col :] = self.pad_block

    def _load(self, rows: DecodeRows, count: int, context: int) -> None:
        """Copy the rows in, padded to ``count`` rows and ``context`` key positions."""
        width = context // self.block_size
        host = torch.empty(count, self.table_col + width, dtype=torch.long)
        host[:, 0], host[:, 1], host[:, 2 : self.table_col] = PAD_TOKEN, 1, 0
        host[:, self.table_col :] = self.pad_block
        real = len(rows.req_ids)
        host[:real, 0] = torch.tensor(rows.token_ids)
        host[:real, 1] = torch.tensor(rows.seq_lens)
        host[:real, 2 : self.table_col] = torch.tensor(rows.positions)
        for i, table in enumerate(rows.block_tables):
            used = min(table.numel(), width)
            host[i, self.table_col : self.table_col + used] = table[:used]
        self.rows[:count, : host.shape[1]].copy_(host, non_blocking=True)

    def _forward(self, count: int, context: int) -> None:
        """Bucket (count, context): static shapes, device tensors only, no host reads."""
        bs = self.block_size
        rows = self.rows[:count]
        tokens, seq_lens = rows[:, 0], rows[:, 1]
        positions = rows[:, 2 : self.table_col].t() if self.num_positions == 3 else rows[:, 2]
        tables = rows[:, self.table_col : self.table_col + context // bs]
        last = seq_lens - 1
        slots = tables.gather(1, (last // bs)[:, None])[:, 0] * bs + last % bs
        meta = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=self._query_start[: count + 1],
            seq_lens=seq_lens,
            block_tables=tables,
            block_size=bs,
            query_lens_host=[1] * count,
            seq_lens_host=[],
            use_kernel=False,
            static_decode=StaticDecodePlan.build(tables, seq_lens, bs),
        )
        with self._attention_kernels():
            hidden = self.model(self.model.embed(tokens), positions, self.cache, meta)
        self.hidden[:count].copy_(hidden)

    def _attention_kernels(self) -> contextlib.AbstractContextManager[Any]:
        """On CUDA, SDPA's memory-efficient kernel (masks, float32 and half precision alike)
        or the math one: a known choice under capture. Elsewhere, SDPA's own."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
