"""EncoderStore: the tiers below the in-process encoder cache behind one interface."""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Sequence
from math import inf
from threading import Lock

import torch

from mmserve.inputs import MultiModalItem
from mmserve.store.codec import CorruptEntry, StoreCodec
from mmserve.store.disk import DiskTier
from mmserve.store.election import LeaseElection
from mmserve.store.held import HeldKeys
from mmserve.store.keys import StoreKeyer
from mmserve.store.lease import EncodeLease
from mmserve.store.lookup import LookupResult, StoreLookup
from mmserve.store.metrics import StoreMetrics
from mmserve.store.ram import RamTier
from mmserve.store.redis_tier import RedisTier, TierUnavailable
from mmserve.store.writer import WriteBehind

logger = logging.getLogger(__name__)

ByteTier = DiskTier | RedisTier
ERROR_LOG_INTERVAL_S = 60.0
EXIT_FLUSH_S = 10.0


class EncoderStore:
    """L1 host RAM (``RamTier``), L2 local disk (``DiskTier``), L3 Redis (``RedisTier``).

    Invariants:
    - a lookup returns a tensor only if it verified (``StoreCodec``: MAC, key, dtype, rows);
      a value that fails is deleted from its tier, counted and logged, and the lookup goes on
      to the next tier: corruption costs a re-encode, never an error or wrong embeddings;
    - lookups run on the store's threads (an L1 hit is answered at once); one lookup per store
      key is in flight, shared by the prompts that want it; a tier failure is a miss;
    - writes (encoded outputs to L2 + L3, device-cache evictions to L1, an L3 hit copied to
      L2) are write-behind through one bounded queue (``WriteBehind``): callers never block;
    - an encoded output is written only to the tiers not known to hold its key (``HeldKeys``
      per tier: this process's verified hits and stored writes; a miss, a corrupt entry, a
      failed write, a disk eviction or half the Redis TTL forgets it), so re-encoding an
      evicted entry the store holds queues nothing; nor does re-encoding one whose write is
      still queued (if that write then fails, a later lookup misses and writes it);
    - with Redis and ``lease_ms`` > 0, a lookup that misses every tier takes the item's
      encode lease (``EncodeLease``) and answers a miss (encode here), unless another replica
      holds it: then it answers that replica's future result (``LeaseWaits``: the stored
      embedding, or None to encode here once the lease ended without one); the holder renews
      it while it lives (``EncodeLease``) and releases it after the item's write (or when
      nothing needs writing, or ``abandoned``: no request wants it any more), and a lease it
      never releases expires; a key whose lease this process holds is a plain miss, as the
      encoder cache deduplicates within a process;
    - nothing here raises into the caller for a tier's failure.
    """

    def __init__(
        self,
        keyer: StoreKeyer,
        codec: StoreCodec,
        ram: RamTier | None,
        tiers: Sequence[ByteTier],
        write_queue: int = 64,
        lookup_threads: int = 4,
        lease_ms: int = 0,
    ) -> None:
        self.keyer = keyer
        self.codec = codec
        self.ram = ram
        self.tiers = list(tiers)
        self.disk = next((t for t in self.tiers if isinstance(t, DiskTier)), None)
        self.held = {
            tier.name: HeldKeys(max_age_s=tier.ttl_s / 2 if isinstance(tier, RedisTier) else inf)
            for tier in self.tiers
        }
        self._pending: set[str] = set()  # store keys whose write is queued or running
        self._pending_lock = Lock()
        self.metrics = StoreMetrics()
        self.writer = WriteBehind(write_queue, self.metrics)
        atexit.register(self.writer.flush, EXIT_FLUSH_S)  # a short-lived process keeps its writes
        self._pool = concurrent.futures.ThreadPoolExecutor(
            lookup_threads, thread_name_prefix="mmserve-store-lookup"
        )
        self._inflight: dict[str, concurrent.futures.Future[LookupResult]] = {}
        self._lock = Lock()
        self._last_error_log: dict[str, float] = {}
        self._closed = False
        redis = next((t for t in self.tiers if isinstance(t, RedisTier)), None)
        self.lease = EncodeLease(redis, lease_ms) if redis is not None and lease_ms > 0 else None
        self.election = LeaseElection(self.lease, self._read, self._tier_error, self.metrics)
        self.waits = self.election.waits

    # ---- lookups ---------------------------------------------------------------------
    def lookup(
        self, items: Sequence[MultiModalItem], skip: Callable[[str], bool] | None = None
    ) -> StoreLookup | None:
        """Start looking up ``items`` (``skip``: item keys not to look up, e.g. those the
        device cache holds). None when nothing needs looking up."""
        futures: dict[str, concurrent.futures.Future[LookupResult]] = {}
        if self._closed:
            return None
        for item in items:
            if item.key in futures or (skip is not None and skip(item.key)):
                continue
            futures[item.key] = self._start(self.keyer.key(item.key), item.length)
        return StoreLookup(futures, self.metrics) if futures else None

    def _start(self, skey: str, rows: int) -> concurrent.futures.Future[LookupResult]:
        if self.ram is not None:
            tensor = self.ram.get(skey)
            self.metrics.add("ram_hits" if tensor is not None else "ram_misses")
            if tensor is not None and tensor.shape[0] == rows:
                done: concurrent.futures.Future[LookupResult] = concurrent.futures.Future()
                done.set_result(tensor)
                return done
        if not self.tiers:
            miss: concurrent.futures.Future[LookupResult] = concurrent.futures.Future()
            miss.set_result(None)
            return miss
        with self._lock:
            fut = self._inflight.get(skey)
            if fut is None:
                fut = self._pool.submit(self._fetch, skey, rows)
                self._inflight[skey] = fut
        fut.add_done_callback(lambda f: self._finished(skey, f))
        return fut

    def _finished(self, skey: str, fut: concurrent.futures.Future[LookupResult]) -> None:
        with self._lock:
            if self._inflight.get(skey) is fut:
                del self._inflight[skey]

    def _fetch(self, skey: str, rows: int) -> LookupResult:
        tensor = self._read(skey, rows)
        if tensor is not None or self.lease is None:
            return tensor
        return self.election.elect(self.lease, skey, rows)

    def abandoned(self, item_keys: Sequence[str]) -> None:
        """No request of this process wants these items any more (those that ended before
        their encode): the leases held for them and not released by a write are given back
        in the background, so the waiting replicas take over now."""
        if self.lease is None or not self.lease.holding:
            return
        for skey in {self.keyer.key(key) for key in item_keys}:
            with self._pending_lock:
                if skey in self._pending or not self.lease.holds(skey):
                    continue  # not held, or its write releases it
            self.writer.submit(functools.partial(self.election.release, skey))

    def _read(self, skey: str, rows: int) -> torch.Tensor | None:
        for tier in self.tiers:
            start = time.perf_counter()
            try:
                blob = tier.get(skey)
            except Exception as exc:
                self._tier_error(tier.name, exc)
                continue
            finally:
                self.metrics.add(f"{tier.name}_lookup_seconds", time.perf_counter() - start)
            if blob is None:
                self.held[tier.name].discard(skey)
                self.metrics.add(f"{tier.name}_misses")
                continue
            try:
                tensor = self.codec.decode(skey, blob, rows)
            except CorruptEntry as exc:
                self._corrupt(tier, skey, exc)
                continue
            self.held[tier.name].add(skey)
            self.metrics.add(f"{tier.name}_hits")
            self.metrics.add(f"{tier.name}_bytes", len(blob))
            if self.disk is not None and tier is not self.disk:
                self._promote(self.disk, skey, blob)
            return tensor
        return None

    def _promote(self, disk: DiskTier, skey: str, blob: bytes) -> None:
        """An L3 hit is copied to L2, so this host finds it locally next time."""
        self.writer.submit(lambda: self._put(disk, skey, blob))

    def _corrupt(self, tier: ByteTier, skey: str, exc: CorruptEntry) -> None:
        self.held[tier.name].discard(skey)
        self.metrics.add(f"{tier.name}_misses")
        self.metrics.add("corrupt_entries")
        if exc.mac:
            self.metrics.add("mac_failures")
        logger.warning("encoder store: %s entry %s is invalid (%s): deleted", tier.name, skey, exc)
        try:
            tier.delete(skey)
        except Exception as delete_exc:
            self._tier_error(tier.name, delete_exc)

    def _tier_error(self, tier: str, exc: Exception) -> None:
        self.metrics.add(f"{tier}_errors")
        if isinstance(exc, TierUnavailable):
            return
        now = time.monotonic()
        if now - self._last_error_log.get(tier, -ERROR_LOG_INTERVAL_S) >= ERROR_LOG_INTERVAL_S:
            self._last_error_log[tier] = now
            logger.warning("encoder store: %s tier failed (%s: %s); serving without it for now",
                           tier, type(exc).__name__, exc)  # fmt: skip

    # ---- writes (write-behind) -------------------------------------------------------
    def encoded(self, item_key: str, tensor: torch.Tensor) -> None:
        """An embedding the encoder just computed: written in the background to the tiers
        not known to hold it, then its encode lease released (if this process holds it)."""
        skey = self.keyer.key(item_key)
        with self._pending_lock:
            if skey in self._pending:
                return  # its write is queued already (a re-encode racing its own write)
            tiers = [tier for tier in self.tiers if not self._holds(tier, skey)]
            if not tiers:
                if self.election.holds(skey):
                    self.writer.submit(lambda: self.election.release(skey))
                return
            self._pending.add(skey)
        if not self.writer.submit(lambda: self._write(skey, tensor, tiers)):
            self._done(skey)

    def _done(self, skey: str) -> None:
        with self._pending_lock:
            self._pending.discard(skey)

    def _holds(self, tier: ByteTier, skey: str) -> bool:
        return skey in self.held[tier.name] and (tier is not self.disk or skey in tier)

    def evicted(self, item_key: str, tensor: torch.Tensor) -> None:
        """An embedding the device cache dropped: kept in L1 (host RAM)."""
        ram = self.ram
        if ram is not None and ram.capacity > 0:
            skey = self.keyer.key(item_key)
            own = tensor.device.type == "cpu" and tensor._base is None
            self.writer.submit(lambda: ram.put(skey, tensor if own else tensor.to("cpu").clone()))

    def _write(self, skey: str, tensor: torch.Tensor, tiers: Sequence[ByteTier]) -> None:
        try:
            blob = self.codec.encode(skey, tensor)
            for tier in tiers:
                self._put(tier, skey, blob)
            self.metrics.add("writes")
        finally:
            self.election.release(skey)
            self._done(skey)

    def _put(self, tier: ByteTier, skey: str, blob: bytes) -> None:
        try:
            stored = tier.put(skey, blob)
        except Exception as exc:
            self.held[tier.name].discard(skey)
            self._tier_error(tier.name, exc)
            return
        if stored:
            self.held[tier.name].add(skey)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the queued writes (tests, benchmarks, shutdown)."""
        return self.writer.flush(timeout)

    def close(self) -> None:
        """Finish the queued writes, then stop; later lookups find nothing, writes drop."""
        self._closed = True
        atexit.unregister(self.writer.flush)  # else every closed store lives until exit
        self.writer.close()
        self.election.close()  # the leases of items never encoded here are given back
        self._pool.shutdown(wait=False, cancel_futures=True)
        for tier in self.tiers:
            if isinstance(tier, RedisTier):
                tier.close()
