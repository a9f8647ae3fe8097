"""The ``MediaHandleError`` each way a handle fails to resolve at admission (``HandleBook``), with
its code; every message tells the client what to send instead."""

from __future__ import annotations

from mmserve.inputs import MultiModalItem
from mmserve.multimodal.handles import HandleRecord, MediaHandleError, MediaKind, handle_of


def unknown_uuid(uuid: str) -> MediaHandleError:
    """An image uuid that names no record for this model and tenant."""
    return MediaHandleError(
        f"image uuid {uuid!r} names no image this server has for this model and"
        " cache_salt (or it has expired); send the image with it again",
        "media_handle_not_found",
    )


def unknown_handle(handle: str, kind: MediaKind) -> MediaHandleError:
    """A handle with no record this tenant made (the same answer whoever else made it)."""
    return MediaHandleError(
        f"media handle {handle} is unknown to this model for this cache_salt (or has"
        f" expired); send the {kind} again",
        "media_handle_not_found",
    )


def check_kind(record: HandleRecord, kind: MediaKind) -> None:
    """Raise unless ``record`` is of the ``kind`` named in the part that names it."""
    if record.kind != kind:
        named = {"image": "an image", "video": "a video"}
        raise MediaHandleError(
            f"media handle {record.handle} is {named[record.kind]}, not {named[kind]}: name it"
            f" in {named[record.kind]}_url part (or send the {kind} itself)",
            "media_handle_kind",
        )


def mismatched(record: HandleRecord, kind: MediaKind) -> MediaHandleError:
    """A record made by another model or with other ``kind`` settings than the request's."""
    return MediaHandleError(
        f"media handle {record.handle} was encoded by model {record.model!r} with other {kind}"
        f" settings (mm_processor_kwargs) than this request's; send the {kind} again",
        "media_handle_mismatch",
    )


def check_mode(record: HandleRecord, multi_image: bool, count: int) -> None:
    """Raise unless ``record``'s image was prepared in the multi-image mode of a prompt with
    ``count`` images (``multi_image``)."""
    if record.image.multi_image != multi_image:
        alone = "with other images" if record.image.multi_image else "alone"
        raise MediaHandleError(
            f"media handle {record.handle} was encoded {alone}, and this model prepares the"
            f" images of a prompt with {count} image(s) differently: encode this prompt's"
            " images together in one /v1/mm/encode request, or send them again",
            "media_handle_mode",
        )


def expired(item: MultiModalItem) -> MediaHandleError:
    """A handle's item whose embedding is found in no tier."""
    handle, kind = handle_of(item.hash), item.modality
    return MediaHandleError(
        f"media handle {handle} has expired: its embedding is no longer cached; send"
        f" the {kind} again (or encode it again with /v1/mm/encode)",
        "media_handle_expired",
    )
