"""HandleBook: media handles made by encode-ahead, resolved at admission within their tenant."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from mmserve.inputs import MultiModalItem, ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import (
    HandleRecord,
    MediaHandle,
    MediaHandleError,
    as_handle,
    is_handle,
    uuid_alias,
)
from mmserve.multimodal.image.memo import PreparedImage
from mmserve.multimodal.processor import InputProcessor
from mmserve.multimodal.request_kwargs import canonical
from mmserve.store import EncoderStore
from mmserve.store.records import StoreRecords

MAX_RECORDS = 1 << 16  # in-process records kept (LRU); the store tiers keep theirs
MIN_LOOKUP_S = 1.0  # a handle's embedding is not optional: wait at least this for the store

CachedEmbedding = Callable[[str], "torch.Tensor | None"]
Future = concurrent.futures.Future


def resolved(tensor: torch.Tensor) -> Future[torch.Tensor | None]:
    """``tensor`` as a resolved future, the shape a store lookup's hits take."""
    fut: Future[torch.Tensor | None] = Future()
    fut.set_result(tensor)
    return fut


class HandleBook:
    """Handle -> ``HandleRecord`` (and tenant-scoped uuid -> handle), in process and in the
    encoder store's tiers.

    Invariants:
    - a handle resolves only for the tenant that made it: the record's image must give exactly
      the handle as its item key under the requester's ``cache_salt`` (any other tenant, model
      or unknown handle gets the same "unknown" answer, so nothing tells that another tenant has
      an image); it must have been made by this model name with the request's image settings,
      and in the multi-image mode the prompt's image count takes;
    - every item of a resolved handle is marked ``by_handle`` and gets a host copy of its
      embedding at admission, from the encoder cache (``cached_embedding``) or the store, so an
      eviction while the request runs is a load, never an encode; an embedding found in no
      tier is ``MediaHandleError`` ("expired": send the image again), raised before the prompt
      reaches the engine;
    - records of encode-ahead are written only after their embeddings were computed or found
      (``register``); a chat that sends an image with a ``uuid`` registers it once admitted,
      before its step encodes it: a prompt naming that uuid meanwhile finds no embedding and
      gets the "expired" answer (send the image again), never a wrong one.
    """

    def __init__(
        self,
        processor: InputProcessor,
        store: EncoderStore | None,
        cached_embedding: CachedEmbedding,
        store_timeout_s: float,
    ) -> None:
        self.processor = processor
        self.store = store
        self.records = StoreRecords(store) if store is not None else None
        self.cached_embedding = cached_embedding
        self.lookup_timeout_s = max(store_timeout_s, MIN_LOOKUP_S)
        self._local: OrderedDict[str, HandleRecord] = OrderedDict()
        self._aliases: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    # ---- making handles ------------------------------------------------------------------
    def record(self, prompt: PromptInput, index: int) -> HandleRecord:
        """The record of image ``index`` of an encode prompt whose images are prepared."""
        prepared = prompt.images[index]
        assert isinstance(prepared, PreparedImage)
        uuid = prompt.uuids[index] if prompt.uuids is not None else None
        merged = self.processor.check_mm_kwargs(prompt.mm_processor_kwargs)
        base = dataclasses.replace(
            prepared, mm_hash=self.processor.base_hash(prepared, uuid, merged)
        )
        handle = self.processor.item_key(base, None, prompt.cache_salt)
        return HandleRecord.of(handle, base, self._model, self._settings(prompt))

    def register(
        self,
        records: Sequence[HandleRecord],
        prompt: PromptInput,
        indexes: Sequence[int] | None = None,
    ) -> None:
        """Keep the records (and the uuids' aliases) here and in the store's tiers; record
        ``k`` is of image ``indexes[k]`` of ``prompt`` (default: image ``k``)."""
        for k, record in enumerate(records):
            i = indexes[k] if indexes is not None else k
            self._remember(self._local, record.handle, record)
            if self.records is not None:
                self.records.put(f"handle:{record.handle}", record.to_bytes())
            uuid = prompt.uuids[i] if prompt.uuids is not None else None
            if uuid is not None:
                alias = uuid_alias(uuid, prompt.cache_salt)
                self._remember(self._aliases, alias, record.handle)
                if self.records is not None:
                    self.records.put(f"uuid:{alias}", record.handle.encode())

    def named(self, prompt: PromptInput) -> tuple[PromptInput, list[int]]:
        """``prompt`` with its images prepared when any image sent with data has a ``uuid``
        (vLLM's shape: the client may then send the uuid alone), and those images' indexes,
        for ``register_named`` once the prompt is admitted (handles resolved first)."""
        uuids = prompt.uuids or []
        named = [i for i, uuid in enumerate(uuids) if uuid is not None]
        return (self.prepared(prompt), named) if named else (prompt, [])

    def register_named(self, prompt: PromptInput, named: Sequence[int]) -> None:
        """Register images ``named`` of an admitted prompt (``named`` gave both) under their
        uuids, before any step encodes them (see the class' invariants)."""
        if named:
            self.register([self.record(prompt, i) for i in named], prompt, named)

    def prepared(self, prompt: PromptInput) -> PromptInput:
        """``prompt`` with every image decoded and prepared (``PreparedImage``), as the
        processor would, so records can describe them."""
        processor = self.processor
        processor.check_num_images(len(prompt.images))  # before decoding any
        multi_image = processor.preparer.multi_image(len(prompt.images))
        salt, kwargs = prompt.cache_salt, prompt.mm_processor_kwargs
        images = [
            image
            if isinstance(image, PreparedImage)
            else processor.prepare_image(image, salt, kwargs, multi_image)
            for image in prompt.images
        ]
        return dataclasses.replace(prompt, images=images)

    # ---- resolving them ------------------------------------------------------------------
    def resolve(self, prompt: PromptInput) -> tuple[PromptInput, set[str]]:
        """``prompt`` with each handle replaced by its record's image, and the handles used."""
        if not any(is_handle(image) for image in prompt.images):
            return prompt, set()
        images, used = list(prompt.images), set()
        multi_image = self.processor.preparer.multi_image(len(images))
        for i, source in enumerate(images):
            if is_handle(source):
                record = self._find(as_handle(source), prompt)
                self._check_mode(record, multi_image, len(images))
                images[i] = record.image
                used.add(record.handle)
        uuids = prompt.uuids
        if uuids is not None:  # a handle's image carries its key already
            uuids = [None if is_handle(s) else u for s, u in zip(prompt.images, uuids, strict=True)]
        return dataclasses.replace(prompt, images=images, uuids=uuids), used

    def embeddings(self, processed: ProcessedPrompt, used: set[str]) -> dict[str, Future]:
        """Mark the items of ``used`` handles ``by_handle`` and return their embeddings (item
        key -> resolved future, as a store lookup gives them); ``MediaHandleError`` for one
        found nowhere. Blocking (store reads): never on the event loop or the engine thread."""
        if not used:
            return {}
        items = processed.mm_items
        for idx, item in enumerate(items):
            if item.hash.split("#", 1)[0] in used:
                items[idx] = dataclasses.replace(item, by_handle=True)
        found: dict[str, Future] = {}
        missing: list[MultiModalItem] = []
        for item in items:
            if item.by_handle and item.key not in found:
                tensor = self.cached_embedding(item.key)
                if tensor is not None:
                    found[item.key] = resolved(tensor)
                else:
                    missing.append(item)
        lookup = self.store.lookup(missing) if self.store is not None and missing else None
        if lookup is not None:
            lookup.wait(self.lookup_timeout_s)
            found.update((key, resolved(tensor)) for key, tensor in lookup.hits().items())
        gone = [item for item in missing if item.key not in found]
        if gone:
            handle = gone[0].hash.split("#", 1)[0]
            raise MediaHandleError(
                f"media handle {handle} has expired: its embedding is no longer cached; send"
                " the image again (or encode it again with /v1/mm/encode)",
                "media_handle_expired",
            )
        return found

    # ---- internals -----------------------------------------------------------------------
    @property
    def _model(self) -> str:
        return self.processor.model_config.model

    def _settings(self, prompt: PromptInput) -> str:
        kwargs = self.processor.image_kwargs(prompt.mm_processor_kwargs)
        return "" if kwargs is None else canonical(kwargs)

    def _find(self, ref: MediaHandle, prompt: PromptInput) -> HandleRecord:
        salt = prompt.cache_salt
        handle = ref.handle
        if handle is None:
            assert ref.uuid is not None
            alias = uuid_alias(ref.uuid, salt)
            handle = self._aliases.get(alias) or self._stored_alias(alias)
            if handle is None:
                raise MediaHandleError(
                    f"image uuid {ref.uuid!r} names no image this server has for this model and"
                    " cache_salt (or it has expired); send the image with it again",
                    "media_handle_not_found",
                )
        record = self._local.get(handle) or self._stored_record(handle)
        if record is None or self.processor.item_key(record.image, None, salt) != handle:
            raise MediaHandleError(
                f"media handle {handle} is unknown to this model for this cache_salt (or has"
                " expired); send the image again",
                "media_handle_not_found",
            )
        if record.model != self._model or record.settings != self._settings(prompt):
            raise MediaHandleError(
                f"media handle {handle} was encoded by model {record.model!r} with other image"
                " settings (mm_processor_kwargs) than this request's; send the image again",
                "media_handle_mismatch",
            )
        return record

    def _check_mode(self, record: HandleRecord, multi_image: bool, count: int) -> None:
        if record.image.multi_image != multi_image:
            alone = "with other images" if record.image.multi_image else "alone"
            raise MediaHandleError(
                f"media handle {record.handle} was encoded {alone}, and this model prepares the"
                f" images of a prompt with {count} image(s) differently: encode this prompt's"
                " images together in one /v1/mm/encode request, or send them again",
                "media_handle_mode",
            )

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
