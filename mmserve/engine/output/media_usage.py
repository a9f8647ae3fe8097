"""Per-input summary of how a request's images and videos got their embeddings."""

from __future__ import annotations

from collections.abc import Sequence

from mmserve.engine.outputs import MediaUsage
from mmserve.inputs import MultiModalItem
from mmserve.request import EmbeddingSource

NOT_COMPUTED = "not_computed"
_COST = {source.label: int(source) for source in EmbeddingSource} | {NOT_COMPUTED: -1}


def _starts_input(item: MultiModalItem, previous: MultiModalItem | None) -> bool:
    if item.video is not None:
        return item.video.index == 0
    if item.crop is None or previous is None or previous.crop is None:
        return True
    return item.crop == 0


def summarize_media(
    items: Sequence[MultiModalItem], sources: Sequence[EmbeddingSource | None]
) -> list[MediaUsage]:
    """One ``MediaUsage`` per image / video in prompt order: a video's frame groups and an
    image's crops are pieces of one input. A piece without a source was never reached."""
    grouped: list[tuple[str, list[int], dict[str, int]]] = []
    previous: MultiModalItem | None = None
    for item, source in zip(items, sources, strict=True):
        label = NOT_COMPUTED if source is None else source.label
        if _starts_input(item, previous):
            grouped.append((item.modality, [], {}))
        _, lengths, pieces = grouped[-1]
        lengths.append(item.length)
        pieces[label] = pieces.get(label, 0) + 1
        previous = item
    counts = {"image": 0, "video": 0}
    summary = []
    for modality, lengths, pieces in grouped:
        summary.append(
            MediaUsage(
                modality, counts[modality], sum(lengths), max(pieces, key=_COST.__getitem__), pieces
            )
        )
        counts[modality] += 1
    return summary
