"""The encoder store as a library: keys, values, tiers, lookups, write-behind (no engine)."""

from __future__ import annotations

import shutil
import threading

import pytest
import torch

from mmserve.config import EncoderStoreConfig
from mmserve.inputs import MultiModalItem
from mmserve.multimodal.hashing import salted
from mmserve.store.codec import CorruptEntry, StoreCodec
from mmserve.store.disk import DiskTier
from mmserve.store.factory import resolve_secret
from mmserve.store.fingerprint import weights_fingerprint
from mmserve.store.held import HeldKeys
from mmserve.store.keys import StoreKeyer
from mmserve.store.ram import RamTier
from mmserve.store.store import EncoderStore

SECRET = b"0123456789abcdef-test-secret"


def item(seed: int, rows: int = 4) -> MultiModalItem:
    return MultiModalItem(hash=f"{seed:064x}", offset=0, length=rows)


def emb(seed: int, rows: int = 4, width: int = 8) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))


def make_store(tmp_path, ram: int = 0, queue: int = 64, secret: bytes = SECRET) -> EncoderStore:
    return EncoderStore(
        StoreKeyer("fp", "float32"),
        StoreCodec(secret, torch.float32),
        RamTier(ram) if ram else None,
        [DiskTier(tmp_path / "l2", 1 << 20)],
        queue,
    )


def test_store_key_covers_version_weights_dtype_salt_and_item():
    base = StoreKeyer("weights-a", "float32")
    key = base.key(item(1).key)
    assert len(key) == 64 and key == StoreKeyer("weights-a", "float32").key(item(1).key)
    others = {
        StoreKeyer("weights-b", "float32").key(item(1).key),
        StoreKeyer("weights-a", "bfloat16").key(item(1).key),
        base.key(salted(item(1).hash, "tenant-a") + ":4"),
        base.key(item(1, rows=5).key),
        base.key(item(2).key),
    }
    assert key not in others and len(others) == 5
    with pytest.raises(ValueError, match="fingerprint"):
        StoreKeyer("", "float32")


def test_codec_round_trip_is_bit_identical_and_rejects_any_damage():
    codec = StoreCodec(SECRET, torch.float32)
    tensor = emb(0)
    blob = codec.encode("k1", tensor)
    assert torch.equal(codec.decode("k1", blob, 4), tensor)
    flipped = bytearray(blob)
    flipped[-3] ^= 1
    damaged = {
        "tampered": bytes(flipped),
        "truncated": blob[: len(blob) // 2],
        "empty": b"",
    }
    for bad in damaged.values():
        with pytest.raises(CorruptEntry):
            codec.decode("k1", bad, 4)
    with pytest.raises(CorruptEntry) as moved:  # a valid value copied under another key
        codec.decode("k2", blob, 4)
    assert moved.value.mac
    with pytest.raises(CorruptEntry) as other_secret:
        StoreCodec(b"another-secret-of-16+", torch.float32).decode("k1", blob, 4)
    assert other_secret.value.mac
    with pytest.raises(CorruptEntry, match="rows"):
        codec.decode("k1", blob, 5)
    with pytest.raises(CorruptEntry):  # stored as float32, wanted bfloat16
        StoreCodec(SECRET, torch.bfloat16).decode("k1", blob, 4)
    with pytest.raises(ValueError, match="16 bytes"):
        StoreCodec(b"short", torch.float32)


def test_ram_tier_is_a_byte_capped_lru():
    ram = RamTier(3 * 4 * 8 * 4)  # three 4x8 float32 tensors
    for i in range(3):
        ram.put(f"k{i}", emb(i))
    assert ram.get("k0") is not None  # k0 is now the most recent
    ram.put("k3", emb(3))
    assert ram.get("k1") is None and ram.get("k0") is not None and len(ram) == 3
    assert ram.num_bytes == 3 * 128
    ram.put("huge", torch.zeros(100, 100))  # larger than the whole tier: not kept
    assert ram.get("huge") is None and ram.num_bytes == 3 * 128


def test_disk_tier_survives_reopen_keeps_its_cap_and_lru_order(tmp_path):
    disk = DiskTier(tmp_path, 300)
    for i in range(3):
        disk.put(f"{i:02x}key", bytes([i]) * 100)
    assert disk.get("00key") == bytes([0]) * 100  # refreshed: 01key is now the oldest
    disk.put("03key", b"x" * 100)
    assert disk.get("01key") is None and disk.num_bytes == 300
    assert not list(tmp_path.glob(".tmp-*"))
    reopened = DiskTier(tmp_path, 300)
    assert len(reopened) == 3 and reopened.get("03key") == b"x" * 100
    smaller = DiskTier(tmp_path, 150)  # a lower cap at start-up evicts down to it
    assert smaller.num_bytes <= 150 and len(smaller) == 1
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="encoder_store_dir"):
        DiskTier(blocker / "sub", 10)


def test_store_round_trip_through_disk_and_ram(tmp_path):
    store = make_store(tmp_path, ram=1 << 20)
    a, b = item(1), item(2)
    store.encoded(a.key, emb(1))
    store.evicted(b.key, emb(2))
    assert store.flush(5)
    lookup = store.lookup([a, b])
    assert lookup is not None
    lookup.wait(5)
    hits = lookup.hits()
    assert torch.equal(hits[a.key], emb(1)) and torch.equal(hits[b.key], emb(2))
    assert store.metrics.get("disk_hits") == 1 and store.metrics.get("ram_hits") == 1
    fresh = make_store(tmp_path)  # a restart: L1 is gone, L2 is not
    again = fresh.lookup([a, b])
    assert again is not None
    again.wait(5)
    assert set(again.hits()) == {a.key}
    assert store.lookup([a], skip=lambda key: True) is None


def test_tampered_entry_is_a_miss_counted_and_deleted(tmp_path):
    store = make_store(tmp_path)
    a = item(1)
    store.encoded(a.key, emb(1))
    store.flush(5)
    path = store.tiers[0].path_of(store.keyer.key(a.key))  # type: ignore[union-attr]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    lookup = store.lookup([a])
    assert lookup is not None
    lookup.wait(5)
    assert lookup.hits() == {}
    assert store.metrics.get("mac_failures") == 1 and not path.exists()
    other = make_store(tmp_path, secret=b"a-different-secret-value")  # wrong secret: a miss
    store.encoded(a.key, emb(1))
    store.flush(5)
    lookup = other.lookup([a])
    assert lookup is not None
    lookup.wait(5)
    assert lookup.hits() == {} and other.metrics.get("mac_failures") == 1


def test_full_write_queue_drops_and_counts_never_blocks(tmp_path):
    store = make_store(tmp_path, queue=2)
    gate = threading.Event()
    store.writer.submit(gate.wait)  # the writer is now busy on this job
    for i in range(5):
        store.encoded(item(i).key, emb(i))
    assert store.metrics.get("writes_dropped") >= 3
    gate.set()
    store.flush(5)
    assert store.metrics.get("writes") <= 2


def test_an_entry_is_written_again_only_once_the_tier_lost_it(tmp_path):
    store = make_store(tmp_path)
    disk = store.tiers[0]
    assert isinstance(disk, DiskTier)
    a = item(1)
    blob_size = len(store.codec.encode(store.keyer.key(a.key), emb(1)))
    store.encoded(a.key, emb(1))
    store.flush(5)
    store.encoded(a.key, emb(1))  # re-encoded after an eviction: the disk holds it
    store.flush(5)
    assert store.metrics.get("writes") == 1
    disk.capacity = 2 * blob_size  # two more entries evict it
    for seed in (2, 3):
        store.encoded(item(seed).key, emb(seed))
    store.flush(5)
    assert store.keyer.key(a.key) not in disk
    store.encoded(a.key, emb(1))
    store.flush(5)
    assert store.metrics.get("writes") == 4 and store.keyer.key(a.key) in disk


def test_a_reencode_racing_its_own_queued_write_queues_nothing(tmp_path):
    """The write of A is still queued when A is encoded again (an evicted image re-encoded at
    once): one write, not two (it was two, and an engine test counting writes was flaky)."""
    store, a = make_store(tmp_path), item(1)
    gate = threading.Event()
    store.writer.submit(gate.wait)  # hold the writer thread
    store.encoded(a.key, emb(1))
    store.encoded(a.key, emb(1))
    gate.set()
    assert store.flush(10)
    assert store.metrics.get("writes") == 1
    store.encoded(a.key, emb(1))  # written and held: nothing more
    assert store.flush(10) and store.metrics.get("writes") == 1
    store.close()


def test_a_dropped_write_is_not_left_pending(tmp_path):
    store, a = make_store(tmp_path, queue=1), item(1)
    started, gate = threading.Event(), threading.Event()
    store.writer.submit(lambda: (started.set(), gate.wait()))  # the writer thread held
    assert started.wait(10)
    assert store.writer.submit(lambda: None)  # the queue's one slot taken
    store.encoded(a.key, emb(1))  # dropped
    gate.set()
    assert store.flush(10) and store.metrics.get("writes") == 0
    store.encoded(a.key, emb(1))  # not pending: queued this time
    assert store.flush(10) and store.metrics.get("writes") == 1
    store.close()


def test_held_keys_forget_by_age_overflow_and_discard(monkeypatch):
    held = HeldKeys(capacity=2, max_age_s=10)
    now = [100.0]
    monkeypatch.setattr("mmserve.store.held.time.monotonic", lambda: now[0])
    held.add("a")
    held.add("b")
    assert "a" in held  # refreshes a: b is now the least recently used
    held.add("c")
    assert "b" not in held and "a" in held and len(held) == 2
    held.discard("a")
    assert "a" not in held
    now[0] += 11
    assert "c" not in held and len(held) == 0


def test_late_lookup_is_a_miss_and_counted(tmp_path):
    store = make_store(tmp_path)
    gate = threading.Event()
    slow_get = store.tiers[0].get
    store.tiers[0].get = lambda key: (gate.wait(), slow_get(key))[1]  # type: ignore[method-assign]
    lookup = store.lookup([item(1)])
    assert lookup is not None
    lookup.wait(0.01)
    assert lookup.hits() == {} and store.metrics.get("late_lookups") == 1
    gate.set()


def test_weights_fingerprint_follows_content_not_path(tmp_path):
    from mmserve.models.tiny import resolve_model_path

    src = resolve_model_path("tiny-llava")
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    assert weights_fingerprint(copy) == weights_fingerprint(src)
    weights = sorted(copy.glob("*.safetensors"))[0]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert weights_fingerprint(copy) != weights_fingerprint(src)
    with pytest.raises(ValueError, match="safetensors"):
        weights_fingerprint(tmp_path)


def test_secret_rules(tmp_path, monkeypatch):
    monkeypatch.delenv("MMSERVE_ENCODER_STORE_SECRET", raising=False)

    def config(disk_dir=None, redis_url=None, **kw) -> EncoderStoreConfig:
        return EncoderStoreConfig(0, disk_dir, 1, redis_url, None, **kw)

    with pytest.raises(ValueError, match="encoder_store_secret"):
        resolve_secret(config(redis_url="redis://127.0.0.1:1"))
    disk = config(disk_dir=str(tmp_path))
    assert resolve_secret(disk) == resolve_secret(disk)  # kept in the directory
    monkeypatch.setenv("MMSERVE_ENCODER_STORE_SECRET", "from-the-environment")
    assert resolve_secret(disk) == b"from-the-environment"
    with pytest.raises(ValueError, match="encoder_store_ttl"):
        config(ttl_s=0)


def test_store_settings_are_checked_up_front_and_the_secret_stays_out_of_reprs():
    from mmserve.engine_args import EngineArgs

    assert EngineArgs().encoder_store_config() is None  # no tier set: no store
    config = EngineArgs(encoder_store_dir="/tmp/x").encoder_store_config()
    assert config is not None and config.ram_bytes == 1 << 30
    bad = {
        "encoder_store_timeout_ms": 0,
        "encoder_store_ram": -1,
        "encoder_store_ttl": 0,
        "encoder_store_write_queue": 0,
        "encoder_store_redis": "http://127.0.0.1:6379",
    }
    for name, value in bad.items():
        with pytest.raises(ValueError, match=name):
            EngineArgs(encoder_store_dir="/tmp/x", **{name: value}).encoder_store_config()
    args = EngineArgs(encoder_store_dir="/tmp/x", encoder_store_secret="do-not-print-me")
    assert "do-not-print-me" not in repr(args)
    assert "do-not-print-me" not in repr(args.encoder_store_config())
