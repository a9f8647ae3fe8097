"""L1: host-RAM LRU of embeddings the device cache evicted."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch


class RamTier:
    """Byte-capped LRU of host tensors by store key (no serialization: in-process memory).

    Invariants: ``num_bytes`` is the sum of the held tensors' sizes and never exceeds
    ``capacity``; a tensor larger than ``capacity`` is not kept; ``get`` refreshes recency;
    every method holds one lock (admission threads read, the engine thread writes).
    """

    name = "ram"

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"encoder store RAM capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self.num_bytes = 0
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> torch.Tensor | None:
        with self._lock:
            tensor = self._entries.get(key)
            if tensor is not None:
                self._entries.move_to_end(key)
            return tensor

    def put(self, key: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.num_bytes -= old.numel() * old.element_size()
            if size > self.capacity:
                return
            while self.num_bytes + size > self.capacity:
                _, victim = self._entries.popitem(last=False)
                self.num_bytes -= victim.numel() * victim.element_size()
            self._entries[key] = tensor
            self.num_bytes += size

    def delete(self, key: str) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.num_bytes -= old.numel() * old.element_size()
