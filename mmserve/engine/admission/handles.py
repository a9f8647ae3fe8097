"""HandleBook: media handles made by encode-ahead, resolved at admission within their tenant."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import weakref
from collections.abc import Callable, Sequence

import torch

from mmserve.engine.admission.handle_errors import (
    check_kind,
    check_mode,
    expired,
    mismatched,
    unknown_handle,
    unknown_uuid,
)
from mmserve.engine.admission.handle_records import HandleRecords
from mmserve.inputs import MultiModalItem, ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import (
    VIDEO_CLASSES,
    HandleRecord,
    MediaHandle,
    MediaKind,
    as_handle,
    handle_of,
    is_handle,
    uuid_alias,
)
from mmserve.multimodal.hashing import salted
from mmserve.multimodal.image.memo import PreparedImage
from mmserve.multimodal.processor import InputProcessor
from mmserve.multimodal.request_kwargs import canonical
from mmserve.store import EncoderStore

MIN_LOOKUP_S = 1.0  # a handle's embedding is not optional: wait at least this for the store

CachedEmbedding = Callable[[str], "torch.Tensor | None"]
Future = concurrent.futures.Future


def mark_by_handle(processed: ProcessedPrompt, used: set[str]) -> None:
    """Mark the prompt's items of the ``used`` handles ``by_handle``: they have no pixels and
    are never encoded (``MultiModalItem``)."""
    items = processed.mm_items
    for idx, item in enumerate(items):
        if handle_of(item.hash) in used:
            items[idx] = dataclasses.replace(item, by_handle=True)


def resolved(tensor: torch.Tensor) -> Future[torch.Tensor | None]:
    """``tensor`` as a resolved future, the shape a store lookup's hits take."""
    fut: Future[torch.Tensor | None] = Future()
    fut.set_result(tensor)
    return fut


class HandleBook:
    """Handle -> ``HandleRecord`` (and tenant-scoped uuid -> handle), in process and in the
    encoder store's tiers (kept by ``HandleRecords``).

    Invariants:
    - a handle resolves only for the tenant that made it: the record's image must give exactly
      the handle as its item key under the requester's ``cache_salt`` (a video: its content
      hash so salted), any other tenant, model or unknown handle getting the same "unknown"
      answer, so nothing tells that another tenant has an image; only where its kind is named
      (an image handle in an image part, a video's in a video part: ``media_handle_kind``);
      made by this model name with the request's image (video) settings, and, an image, in the
      multi-image mode the prompt's image count takes;
    - every item of a resolved handle is marked ``by_handle`` and gets a host copy of its
      embedding at admission, from the encoder cache (``cached_embedding``) or the store, so an
      eviction while the request runs is a load, never an encode; an embedding found in no
      tier is ``MediaHandleError`` ("expired": send the image again), raised before the prompt
      reaches the engine;
    - records of encode-ahead are written only after their embeddings were computed or found
      (``register``); a chat that sends an image with a ``uuid`` registers it once admitted,
      before its step encodes it, and lends its items (pixels included) while they live: a
      prompt naming that uuid meanwhile finds no embedding and takes the lent item's pixels,
      as if it had sent the image (the same key: encoded once, shared through the encoder
      cache). Once no admitted prompt or request holds the items (they are weakly kept), such
      a prompt gets the "expired" answer (send the image again), never a wrong one. The Ray
      ingress lends nothing (its prompts are encoded on a replica, which holds no lent item).
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
        self.kept = HandleRecords(store)
        self.cached_embedding = cached_embedding
        self.lookup_timeout_s = max(store_timeout_s, MIN_LOOKUP_S)
        self._lent: weakref.WeakValueDictionary[str, MultiModalItem] = weakref.WeakValueDictionary()
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

    def video_record(self, prompt: PromptInput, index: int) -> HandleRecord:
        """The record of video ``index`` of an encode prompt whose videos are prepared: its
        handle is its content hash salted, which each piece's item hash starts with."""
        video = prompt.videos[index]
        assert isinstance(video, VIDEO_CLASSES)
        handle = salted(video.mm_hash, prompt.cache_salt)
        return HandleRecord.of(handle, video, self._model, self._settings(prompt, "video"))

    def register(
        self,
        records: Sequence[HandleRecord],
        prompt: PromptInput,
        indexes: Sequence[int] | None = None,
    ) -> None:
        """Keep the records (and the uuids' aliases) here and in the store's tiers; record
        ``k`` is of image ``indexes[k]`` of ``prompt`` (default: image ``k``; the images'
        records come first, then the videos', which have no uuid)."""
        for k, record in enumerate(records):
            i = indexes[k] if indexes is not None else k
            named = prompt.uuids is not None and record.kind == "image"
            uuid = prompt.uuids[i] if prompt.uuids is not None and named else None
            alias = uuid_alias(uuid, prompt.cache_salt) if uuid is not None else None
            self.kept.keep(record, alias)

    def named(self, prompt: PromptInput) -> tuple[PromptInput, list[int]]:
        """``prompt`` with its images prepared when any image sent with data has a ``uuid``
        (vLLM's shape: the client may then send the uuid alone), and those images' indexes,
        for ``register_named`` once the prompt is admitted (handles resolved first)."""
        uuids = prompt.uuids or []
        named = [i for i, uuid in enumerate(uuids) if uuid is not None]
        return (self.prepared(prompt), named) if named else (prompt, [])

    def register_named(
        self,
        prompt: PromptInput,
        named: Sequence[int],
        processed: ProcessedPrompt | None = None,
    ) -> None:
        """Register images ``named`` of an admitted prompt (``named`` gave both) under their
        uuids, before any step encodes them, and lend ``processed``'s items of those images
        (see the class' invariants)."""
        if not named:
            return
        records = [self.record(prompt, i) for i in named]
        self.register(records, prompt, named)
        if processed is not None:
            handles = {record.handle for record in records}
            with self._lock:
                for item in processed.mm_items:
                    if not item.by_handle and handle_of(item.hash) in handles:
                        self._lent[item.key] = item

    def prepared(self, prompt: PromptInput) -> PromptInput:
        """``prompt`` with every image (and video) decoded and prepared (``PreparedImage``, a
        prepared video), as the processor would, so records can describe them."""
        processor = self.processor
        processor.check_num_images(len(prompt.images))  # before decoding any
        processor.videos.check_count(len(prompt.videos))
        multi_image = processor.preparer.multi_image(len(prompt.images))
        salt, kwargs = prompt.cache_salt, prompt.mm_processor_kwargs
        images = [
            image
            if isinstance(image, PreparedImage)
            else processor.prepare_image(image, salt, kwargs, multi_image)
            for image in prompt.images
        ]
        videos = [
            video
            if isinstance(video, VIDEO_CLASSES)
            else processor.prepare_video(video, kwargs, salt)
            for video in prompt.videos
        ]
        return dataclasses.replace(prompt, images=images, videos=videos)

    # ---- resolving them ------------------------------------------------------------------
    def resolve(self, prompt: PromptInput) -> tuple[PromptInput, set[str]]:
        """``prompt`` with each handle replaced by its record's image or video, and the handles
        used."""
        if not any(map(is_handle, prompt.images)) and not any(map(is_handle, prompt.videos)):
            return prompt, set()
        images, videos, used = list(prompt.images), list(prompt.videos), set()
        multi_image = self.processor.preparer.multi_image(len(images))
        for i, source in enumerate(images):
            if is_handle(source):
                record = self._find(as_handle(source), prompt, "image")
                check_mode(record, multi_image, len(images))
                images[i] = record.image
                used.add(record.handle)
        for i, source in enumerate(videos):
            if is_handle(source):
                record = self._find(as_handle(source), prompt, "video")
                videos[i] = record.media
                used.add(record.handle)
        uuids = prompt.uuids
        if uuids is not None:  # a handle's image carries its key already
            uuids = [None if is_handle(s) else u for s, u in zip(prompt.images, uuids, strict=True)]
        return dataclasses.replace(prompt, images=images, uuids=uuids, videos=videos), used

    def embeddings(self, processed: ProcessedPrompt, used: set[str]) -> dict[str, Future]:
        """Mark the items of ``used`` handles ``by_handle`` and return their embeddings (item
        key -> resolved future, as a store lookup gives them); ``MediaHandleError`` for one
        found nowhere. Blocking (store reads): never on the event loop or the engine thread."""
        if not used:
            return {}
        mark_by_handle(processed, used)
        items = processed.mm_items
        found: dict[str, Future] = {}
        missing: list[MultiModalItem] = []
        for idx, item in enumerate(items):
            if item.by_handle and item.key not in found:
                tensor = self.cached_embedding(item.key)
                lent = None if tensor is not None else self._lent_item(item.key)
                if tensor is not None:
                    found[item.key] = resolved(tensor)
                elif lent is not None:  # not encoded yet: as if the image had been sent
                    items[idx] = dataclasses.replace(item, data=lent.data, by_handle=False)
                else:
                    missing.append(item)
        lookup = self.store.lookup(missing) if self.store is not None and missing else None
        if lookup is not None:
            lookup.wait(self.lookup_timeout_s)
            found.update((key, resolved(tensor)) for key, tensor in lookup.hits().items())
        gone = [item for item in missing if item.key not in found]
        if gone:
            raise expired(gone[0])
        return found

    # ---- internals -----------------------------------------------------------------------
    def _lent_item(self, key: str) -> MultiModalItem | None:
        with self._lock:
            return self._lent.get(key)

    @property
    def _model(self) -> str:
        return self.processor.model_config.model

    def _settings(self, prompt: PromptInput, kind: MediaKind = "image") -> str:
        """The image processor's settings; a video's: every merged kwarg (frame sampling too)."""
        if kind == "video":
            kwargs = self.processor.check_mm_kwargs(prompt.mm_processor_kwargs)
        else:
            kwargs = self.processor.image_kwargs(prompt.mm_processor_kwargs)
        return "" if kwargs is None else canonical(kwargs)

    def _owned(self, record: HandleRecord, salt: str | None) -> bool:
        """Whether ``record`` was made by the tenant of ``salt`` (its key is the handle)."""
        if record.kind == "video":
            return salted(record.media.mm_hash, salt) == record.handle
        return self.processor.item_key(record.image, None, salt) == record.handle

    def _find(self, ref: MediaHandle, prompt: PromptInput, kind: MediaKind) -> HandleRecord:
        salt = prompt.cache_salt
        handle = ref.handle
        if handle is None:
            assert ref.uuid is not None
            alias = uuid_alias(ref.uuid, salt)
            handle = self.kept.aliased(alias)
            if handle is None:
                raise unknown_uuid(ref.uuid)
        record = self.kept.find(handle)
        if record is None or record.handle != handle or not self._owned(record, salt):
            raise unknown_handle(handle, kind)
        check_kind(record, kind)
        if record.model != self._model or record.settings != self._settings(prompt, kind):
            raise mismatched(record, kind)
        return record
