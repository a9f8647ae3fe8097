"""The encoder store: tiers below the in-process encoder cache (L1 host RAM, L2 local disk,
L3 Redis), so encoder outputs survive restarts and are shared by replicas."""

from mmserve.store.factory import open_encoder_store
from mmserve.store.lookup import StoreLookup
from mmserve.store.store import EncoderStore

__all__ = ["EncoderStore", "StoreLookup", "open_encoder_store"]
