"""Which store keys a tier is known to hold, so a re-encoded entry is not written again."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

DEFAULT_CAPACITY = 16384


class HeldKeys:
    """A bounded LRU of store keys one tier is known to hold, with when that was learnt.

    Invariants: a key is added only on evidence that the tier holds it (a verified hit, a
    completed write) and is forgotten on evidence against it (a miss, a corrupt entry, a
    failed write), when it is older than ``max_age_s`` or when the LRU overflows; forgetting
    only costs a redundant write, so every uncertainty resolves towards writing.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, max_age_s: float = math.inf) -> None:
        if capacity < 1:
            raise ValueError(f"HeldKeys capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.max_age_s = max_age_s
        self._learnt: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._learnt)

    def add(self, key: str) -> None:
        with self._lock:
            self._learnt.pop(key, None)
            self._learnt[key] = time.monotonic()
            while len(self._learnt) > self.capacity:
                self._learnt.popitem(last=False)

    def discard(self, key: str) -> None:
        with self._lock:
            self._learnt.pop(key, None)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        with self._lock:
            learnt = self._learnt.get(key)
            if learnt is None:
                return False
            if time.monotonic() - learnt > self.max_age_s:
                del self._learnt[key]
                return False
            self._learnt.move_to_end(key)
            return True
