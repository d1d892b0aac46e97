"""What the reader tests share: the uneven bundle most of them read, how a DataLoader deals index
batches to its workers, and the loader the decoded-part tests drive."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import BatchSampler, Sampler

from pipeline.readers import Index, make_loader, set_epoch
from tests.helpers.bundles import make_bundle

UNEVEN_SIZES = [1, 300, 2, 250, 100, 199, 157]  # 1,009 items in 7 uneven parts


def uneven_index(root: Path) -> Index:
    """A bundle of :data:`UNEVEN_SIZES` parts staged under ``root``, indexed."""
    return Index.from_snapshot(make_bundle(root, UNEVEN_SIZES))


def dealt_to_workers(sampler: Sampler, batch: int, workers: int) -> list[list[list[int]]]:
    """The index batches of ``sampler``, each on the worker a DataLoader with ``workers``
    workers puts it on (``_MultiProcessingDataLoaderIter`` deals them in turn; 0 workers: one
    list, the main process's)."""
    dealt: list[list[list[int]]] = [[] for _ in range(max(workers, 1))]
    for i, b in enumerate(BatchSampler(sampler, batch, drop_last=False)):
        dealt[i % len(dealt)].append(b)
    return dealt


def shared_parts_loader(index: Index, **kw: Any):
    """A map-style loader whose 2 forked workers share decoded parts; ``kw`` overrides."""
    args: dict[str, Any] = dict(
        style="map", batch_size=16, num_workers=2, seed=3, multiprocessing_context="fork"
    )
    args.update(kw)
    return make_loader(index, **args)


def epoch_batches(loader, epoch: int) -> list[tuple[str, ...]]:
    """The ids of every batch ``loader`` yields in ``epoch``, in order."""
    set_epoch(loader, epoch)
    return [tuple(b["item_id"]) for b in loader]
