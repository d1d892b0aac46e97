"""Build the torch-native DataLoader wiring for either reader in one call.

Map-style: ``DataLoader(MapDataset, batch_size=B, sampler=OwnerSampler, collate_fn=
collate_batches)`` — torch's ``BatchSampler`` groups the sampler's positions, each index batch
goes to one worker, and the worker's fetcher calls ``__getitems__`` once per batch. Iterable:
``DataLoader(PartIterableDataset, batch_size=None, collate_fn=collate_batches)`` — the dataset
batches itself, so torch must not batch again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader

from pipeline.readers.batches import collate_batches
from pipeline.readers.datasets import MapDataset, OwnerSampler, PartIterableDataset
from pipeline.readers.index import Index

#: Rows a worker sends the main process per message by default: large enough that torch's
#: fixed cost per message (one shared-memory segment per tensor) stops dominating.
TRANSFER_ROWS = 4096


def auto_transfer(batch_size: int) -> int:
    """How many batches of ``batch_size`` make one worker message of about ``TRANSFER_ROWS``."""
    return max(1, TRANSFER_ROWS // batch_size)


def make_loader(
    index: Index,
    *,
    style: Literal["map", "iterable"] = "map",
    batch_size: int = 256,
    num_workers: int = 2,
    columns: Sequence[str] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = False,
    transfer_batches: int | None = None,
    **loader_kwargs: Any,
) -> DataLoader | SplitLoader:
    """A DataLoader over this rank's share of ``index``; call ``set_epoch`` via :func:`set_epoch`.

    ``drop_last`` applies to the map-style reader only (whole batches of this rank's share);
    it drops items by design, so reconciliation will then report them missing.
    ``transfer_batches=k > 1`` has each worker fetch ``k * batch_size`` rows per message and
    the main process cut them into ``batch_size`` batches (:class:`SplitLoader`): torch pays a
    fixed cost per worker message (a shared-memory segment per tensor), so this is what makes
    batch 256 run near decode speed. The batches, their order and ownership are unchanged.
    The default (``None``) ships about :data:`TRANSFER_ROWS` rows per message when there are
    worker processes, and plain batches otherwise or with ``drop_last`` (whose meaning would
    change with larger messages); ``transfer_batches=1`` returns a plain ``DataLoader``.
    """
    if transfer_batches is None:
        transfer_batches = 1 if num_workers == 0 or drop_last else auto_transfer(batch_size)
    if transfer_batches > 1 and drop_last:
        raise ValueError("transfer_batches > 1 would change what drop_last drops; use 1")
    if transfer_batches > 1:
        inner = make_loader(
            index,
            style=style,
            batch_size=batch_size * transfer_batches,
            num_workers=num_workers,
            columns=columns,
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            **loader_kwargs,
        )
        return SplitLoader(inner, batch_size)
    if style == "map":
        ds = MapDataset(index, columns)
        sampler = OwnerSampler(index, rank=rank, world_size=world_size, shuffle=shuffle, seed=seed)
        loader_kwargs.setdefault("persistent_workers", num_workers > 0)
        return DataLoader(
            ds,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_batches,
            drop_last=drop_last,
            **loader_kwargs,
        )
    if style == "iterable":
        if drop_last:
            raise ValueError("drop_last is not supported by the iterable reader")
        ids = PartIterableDataset(
            index,
            batch_size=batch_size,
            columns=columns,
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
        )
        # workers copy the dataset when an epoch starts; persistent ones would miss set_epoch
        loader_kwargs.setdefault("persistent_workers", False)
        return DataLoader(
            ids,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=collate_batches,
            **loader_kwargs,
        )
    raise ValueError(f"style must be 'map' or 'iterable', got {style!r}")


class SplitLoader:
    """Iterates a DataLoader of large batches as batches of ``batch_size`` (views, no copy)."""

    def __init__(self, loader: DataLoader, batch_size: int) -> None:
        self.loader = loader
        self.batch_size = batch_size

    @property
    def sampler(self) -> Any:
        """The inner loader's sampler (an :class:`OwnerSampler` for the map-style reader)."""
        return self.loader.sampler

    @property
    def dataset(self) -> Any:
        """The inner loader's dataset."""
        return self.loader.dataset

    def __iter__(self) -> Iterator[dict]:
        bs = self.batch_size
        for big in self.loader:
            n = len(next(iter(big.values())))
            for start in range(0, n, bs):
                yield {
                    k: (
                        v.narrow(0, start, min(bs, n - start))
                        if isinstance(v, torch.Tensor)
                        else v[start : start + bs]
                    )
                    for k, v in big.items()
                }


def set_epoch(loader: DataLoader | SplitLoader, epoch: int) -> None:
    """Tell a loader made by :func:`make_loader` which epoch's order to produce."""
    target = loader.sampler if isinstance(loader.sampler, OwnerSampler) else loader.dataset
    if not hasattr(target, "set_epoch"):
        raise TypeError(f"{type(target).__name__} has no set_epoch")
    target.set_epoch(epoch)
