"""The election of one encoder per missed item: the encode lease and the waits for its holder."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmserve.store.lease import EncodeLease
from mmserve.store.lookup import LookupResult
from mmserve.store.metrics import StoreMetrics
from mmserve.store.waits import LeaseWaits

# a wait outlasting the holder's renewals by this many lease lifetimes ends in a local encode
MAX_LEASES_WAITED = 2
Read = Callable[[str, int], torch.Tensor | None]  # the store's verified read of every tier
OnError = Callable[[str, Exception], None]  # the store's count and log of a tier's failure


class LeaseElection:
    """What a lookup that missed every tier does with the encode lease (``EncodeLease``).

    Invariants: ``elect`` answers None (encode here: this process holds the lease, or Redis
    failed) or a value stored since the miss, or the future of the holder's result
    (``LeaseWaits``); a wait ends once the holder's lease is gone (released after its write,
    expired after its death or its last renewal) with the stored value, or with None once this
    process took the lease over; it ends with None at the latest ``max_hold_s`` plus
    ``MAX_LEASES_WAITED`` lease lifetimes after it began (a holder renews at most
    ``max_hold_s``); a failed Redis call is counted by ``on_error`` and never raises from
    ``elect`` or ``release``.
    """

    def __init__(
        self, lease: EncodeLease | None, read: Read, on_error: OnError, metrics: StoreMetrics
    ) -> None:
        self.lease = lease
        self.read = read
        self.on_error = on_error
        self.metrics = metrics
        self._closed = False
        max_wait_s = 0.0
        if lease is not None:
            max_wait_s = lease.max_hold_s + MAX_LEASES_WAITED * lease.lease_ms / 1000
        self.waits = LeaseWaits(self._poll_wait, max_wait_s, metrics)

    def elect(self, lease: EncodeLease, skey: str, rows: int) -> LookupResult:
        """Every tier missed: take the encode lease (None: encode here), else wait for the
        holder's result. A failed Redis call is a miss (encode here)."""
        if lease.holds(skey):
            return None  # this process encodes it: its encoder cache serves the others
        try:
            if not lease.acquire(skey):
                return self.waits.watch(skey, rows)
        except Exception as exc:
            self.on_error(lease.tier.name, exc)
            return None
        self.metrics.add("lease_acquired")
        tensor = self.read(skey, rows)  # stored and released since the read above?
        if tensor is not None:
            self.release(skey)
        return tensor

    def _poll_wait(self, skey: str, rows: int) -> tuple[bool, torch.Tensor | None]:
        """One poll of a wait (``LeaseWaits``): ended once the holder's lease is gone, with
        the stored value, or with None once this process took the lease over."""
        lease = self.lease
        if lease is None or self._closed:
            return True, None
        try:
            if lease.alive(skey):
                return False, None
            tensor = self.read(skey, rows)
            if tensor is not None:
                return True, tensor
            return lease.holds(skey) or lease.acquire(skey), None
        except Exception as exc:
            self.on_error(lease.tier.name, exc)
            raise

    def holds(self, skey: str) -> bool:
        return self.lease is not None and self.lease.holds(skey)

    def release(self, skey: str) -> None:
        """Give the lease back if this process holds it (a failure: it expires instead)."""
        if self.lease is not None:
            try:
                self.lease.release(skey)
            except Exception as exc:
                self.on_error(self.lease.tier.name, exc)

    def close(self) -> None:
        """End the waits (encode here), stop renewing, give back the leases still held."""
        self._closed = True
        self.waits.close()
        if self.lease is not None:
            self.lease.close()
