"""Store values: safetensors bytes behind a keyed MAC that binds them to their store key."""

from __future__ import annotations

import hmac

import blake3
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from mmserve.config import check_secret

MAGIC = b"MMES\x01"
MAC_BYTES = 32
MAC_CONTEXT = "mmserve 2026 encoder store value MAC v1"


class CorruptEntry(Exception):
    """A stored value failed to verify or decode; ``mac`` says whether the MAC was wrong."""

    def __init__(self, why: str, mac: bool = False) -> None:
        super().__init__(why)
        self.mac = mac


class StoreCodec:
    """Encodes one embedding tensor as ``MAGIC + MAC + safetensors bytes`` and back.

    Invariants: the MAC is blake3 keyed with a key derived from the deployment secret, over the
    store key and the safetensors bytes, so a value that was altered, truncated or copied under
    another key fails before its bytes are parsed; ``decode`` returns a tensor only if it is
    2-D, has the expected row count and the model dtype (values are stored in that dtype, which
    is what the splice converts them to anyway), else raises ``CorruptEntry``.
    """

    def __init__(self, secret: bytes, dtype: torch.dtype) -> None:
        check_secret(secret)
        self._mac_key = blake3.blake3(secret, derive_key_context=MAC_CONTEXT).digest()
        self.dtype = dtype

    def _mac(self, key: str, body: bytes | memoryview) -> bytes:
        hasher = blake3.blake3(key.encode() + b"\0", key=self._mac_key)
        hasher.update(body)
        return hasher.digest()

    def seal(self, key: str, body: bytes, magic: bytes) -> bytes:
        """Any other value (``records``): ``magic + MAC + body`` under the same MAC key."""
        return magic + self._mac(key, body) + body

    def unseal(self, key: str, blob: bytes, magic: bytes) -> bytes:
        """The body of a ``seal``ed value; ``CorruptEntry`` unless it verifies."""
        head = len(magic) + MAC_BYTES
        if len(blob) < head or not blob.startswith(magic):
            raise CorruptEntry("bad header or truncated")
        body = blob[head:]
        if not hmac.compare_digest(blob[len(magic) : head], self._mac(key, body)):
            raise CorruptEntry("MAC mismatch", mac=True)
        return body

    def encode(self, key: str, tensor: torch.Tensor) -> bytes:
        host = tensor.detach().to("cpu", self.dtype).contiguous().clone()
        body = st_save({"embedding": host}, metadata={"key": key})
        return MAGIC + self._mac(key, body) + body

    def decode(self, key: str, blob: bytes, rows: int) -> torch.Tensor:
        head = len(MAGIC) + MAC_BYTES
        if len(blob) <= head or not blob.startswith(MAGIC):
            raise CorruptEntry("bad header or truncated")
        view = memoryview(blob)
        if not hmac.compare_digest(bytes(view[len(MAGIC) : head]), self._mac(key, view[head:])):
            raise CorruptEntry("MAC mismatch", mac=True)
        try:
            tensors = st_load(bytes(view[head:]))
        except Exception as exc:  # authenticated but unparsable: a writer bug, still a miss
            raise CorruptEntry(f"undecodable: {type(exc).__name__}") from exc
        tensor = tensors.get("embedding")
        if tensor is None or len(tensors) != 1 or tensor.dim() != 2:
            raise CorruptEntry("unexpected tensors")
        if tensor.shape[0] != rows or tensor.dtype != self.dtype:
            raise CorruptEntry(f"shape {tuple(tensor.shape)} {tensor.dtype}, wanted {rows} rows")
        return tensor
