"""HandleRecords: where ``HandleBook`` keeps media-handle records and uuid aliases, in process
and in the encoder store's record tiers."""

from __future__ import annotations

import threading
from collections import OrderedDict

from mmserve.multimodal.handles import HandleRecord
from mmserve.store import EncoderStore
from mmserve.store.records import StoreRecords

MAX_RECORDS = 1 << 16  # in-process records kept (LRU); the store tiers keep theirs


class HandleRecords:
    """Handle -> ``HandleRecord`` and uuid alias -> handle, in process and in the store's tiers.

    Invariants:
    - each in-process table holds at most ``MAX_RECORDS`` entries, the one written (or read
      from the store) longest ago dropped first; the store's tiers keep their own;
    - a kept record is written here and, with a store, to its tiers as ``handle:<handle>``
      (its alias, if any, as ``uuid:<alias>``); a store record that does not decode or names
      another handle is a miss, one that does is kept in process too;
    - the tables change only under the lock.
    """

    def __init__(self, store: EncoderStore | None) -> None:
        self.records = StoreRecords(store) if store is not None else None
        self._local: OrderedDict[str, HandleRecord] = OrderedDict()
        self._aliases: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, record: HandleRecord, alias: str | None) -> None:
        """Keep ``record`` (and ``alias`` -> its handle) here and in the store's tiers."""
        self._remember(self._local, record.handle, record)
        if self.records is not None:
            self.records.put(f"handle:{record.handle}", record.to_bytes())
        if alias is not None:
            self._remember(self._aliases, alias, record.handle)
            if self.records is not None:
                self.records.put(f"uuid:{alias}", record.handle.encode())

    def find(self, handle: str) -> HandleRecord | None:
        """The record of ``handle``, in process or else in the store (None: neither has it)."""
        return self._local.get(handle) or self._stored_record(handle)

    def aliased(self, alias: str) -> str | None:
        """The handle ``alias`` names, in process or else in the store (None: neither has it)."""
        return self._aliases.get(alias) or self._stored_alias(alias)

    def _stored_record(self, handle: str) -> HandleRecord | None:
        blob = self.records.get(f"handle:{handle}") if self.records is not None else None
        if blob is None:
            return None
        try:
            record = HandleRecord.from_bytes(blob)
        except (ValueError, KeyError, TypeError):
            return None
        if record.handle != handle:
            return None
        self._remember(self._local, handle, record)
        return record

    def _stored_alias(self, alias: str) -> str | None:
        blob = self.records.get(f"uuid:{alias}") if self.records is not None else None
        return None if blob is None else blob.decode(errors="replace")

    def _remember(self, table: OrderedDict, key: str, value: object) -> None:
        with self._lock:
            table[key] = value
            table.move_to_end(key)
            while len(table) > MAX_RECORDS:
                table.popitem(last=False)
