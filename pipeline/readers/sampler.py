"""Which positions this rank reads, in which order: :class:`OwnerSampler`, resumable.

A torch ``Sampler`` over this rank's contiguous share of the index, permuted inside the share
(:func:`pipeline.readers.split.map_positions`); DataLoader workers then split the rank's index
batches among themselves, each batch going to exactly one worker.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import Any, TypeGuard

import numpy as np
from torch.utils.data import Sampler

from pipeline.readers import split
from pipeline.readers.index import Index
from pipeline.readers.map_style import MapDataset
from pipeline.readers.owner import agree_across_ranks, process_rank
from pipeline.readers.reshard import Leg, legs_from_state, map_pool


def is_count(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a row or position count: an ``int`` (not a ``bool``) ``>= 0``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def state_count(state: Mapping[str, Any], key: str, what: str) -> int:
    """``state[key]`` as a count (:func:`is_count`), or a ``ValueError`` naming ``what``."""
    value = state.get(key) if isinstance(state, Mapping) else None
    if is_count(value):
        return value
    raise ValueError(f"{what} state needs {key!r} as an int >= 0, found {value!r}")


def _identity(index_or_len: Index | MapDataset | int) -> dict[str, Any]:
    """What names the data a sampler splits: the snapshot identity, or just a length."""
    if isinstance(index_or_len, int):
        return {"items": index_or_len}
    ix = index_or_len if isinstance(index_or_len, Index) else index_or_len.index
    return {"items": len(ix), "snapshot": ix.snapshot_tag}


class OwnerSampler(Sampler[int]):
    """Yields this rank's positions: a contiguous share of the index, permuted inside.

    Unlike ``DistributedSampler`` it never pads: shares differ by at most one item and no item
    is repeated, so uneven ranks must finish with ``torch.distributed.algorithms.Join``. The
    rank comes from the arguments or the process group at construction (in the main process);
    DataLoader workers then split this rank's batches among themselves, each batch going to
    exactly one worker. Built under an initialised process group, the ranks compare their split
    parameters once (one ``all_gather_object``) and refuse to differ (:class:`SplitMismatch`).

    Resumable like torchdata's ``StatefulDistributedSampler``: :meth:`state_dict` is
    ``{"epoch", "yielded"}`` (positions this epoch's iterator has handed out) and
    :meth:`load_state_dict` makes the next iteration of that epoch start after them, by slicing
    the order, never by drawing the skipped positions. An epoch resumed at another shape
    carries its earlier ``legs`` (:mod:`pipeline.readers.reshard`): this rank's share is then
    its share of what they left. A prefetching DataLoader draws positions
    ahead of the training loop: checkpoint the loader's state (:func:`make_loader`), which
    counts what was delivered, not the sampler's.
    """

    def __init__(
        self,
        index_or_len: Index | MapDataset | int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        mix: bool = False,
    ) -> None:
        if mix and not shuffle:
            raise ValueError("mix=True is a shuffle: it needs shuffle=True")
        self.n_items = index_or_len if isinstance(index_or_len, int) else len(index_or_len)
        self.rank, self.world_size = process_rank(rank, world_size)
        self.shuffle = shuffle
        self.mix = mix
        self.seed = seed
        self.epoch = 0
        self._next_yielded: int | None = None  # where the next __iter__ starts (resume)
        self._iter: Iterator[int] | None = None  # the current iterator, to count what it yielded
        self._iter_start = 0
        self._iter_len = 0
        self.legs: tuple[Leg, ...] = ()  # earlier legs of this epoch, at other shapes
        self._pool: tuple[tuple[int, tuple[Leg, ...]], np.ndarray, np.ndarray] | None = None
        agree_across_ranks(
            "OwnerSampler",
            {
                **_identity(index_or_len),
                "world_size": self.world_size,
                "shuffle": shuffle,
                "mix": mix,
                "seed": seed,
            },
            self.rank,
            self.world_size,
        )

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order to yield; ownership does not change with it.

        A resume point loaded for another epoch is dropped: it named positions of that epoch.
        """
        if epoch != self.epoch:
            self._next_yielded = None
            self._iter = None
            self.legs = ()  # they named rows of that epoch
        self.epoch = epoch

    def _legs_pool(self) -> tuple[np.ndarray, np.ndarray]:
        """(delivered by the earlier legs, what they left), computed once per epoch and legs."""
        key = (self.epoch, self.legs)
        if self._pool is None or self._pool[0] != key:
            done, pool = map_pool(
                self.n_items,
                self.legs,
                shuffle=self.shuffle,
                seed=self.seed,
                epoch=self.epoch,
                mix=self.mix,
            )
            self._pool = (key, done, pool)
        return self._pool[1], self._pool[2]

    def positions(self) -> np.ndarray:
        """This epoch's positions as an array (what ``__iter__`` yields)."""
        if self.legs or self.mix:
            return split.map_share(
                self._legs_pool()[1],
                self.rank,
                self.world_size,
                shuffle=self.shuffle,
                seed=self.seed,
                epoch=self.epoch,
                leg=len(self.legs),
            )
        return split.map_positions(
            self.n_items,
            self.rank,
            self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
        )

    def delivered_before(self) -> np.ndarray:
        """Positions this epoch's earlier legs delivered (on every rank alike; none if none)."""
        return self._legs_pool()[0] if self.legs else np.zeros(0, dtype=np.int64)

    def __iter__(self) -> Iterator[int]:
        start = self._next_yielded or 0
        self._next_yielded = None
        order = self.positions()[start:].tolist()
        self._iter_start, self._iter_len = start, len(order)
        # a plain list iterator (C speed); what it yielded is read from its length hint
        self._iter = iter(order)
        return self._iter

    @property
    def yielded(self) -> int:
        """Positions of this epoch handed out so far (the resume point, before iterating)."""
        if self._next_yielded is not None:
            return self._next_yielded
        if self._iter is None:
            return 0
        return self._iter_start + self._iter_len - operator.length_hint(self._iter)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "yielded"}`` (and the epoch's earlier ``legs``, if any): JSON-ready."""
        state: dict[str, Any] = {"epoch": self.epoch, "yielded": self.yielded}
        if self.legs:
            state["legs"] = [leg.to_state() for leg in self.legs]
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make the next iteration yield epoch ``state_dict["epoch"]`` from ``yielded`` on."""
        epoch = state_count(state_dict, "epoch", "OwnerSampler")
        yielded = state_count(state_dict, "yielded", "OwnerSampler")
        before = self.epoch, self.legs
        self.epoch, self.legs = epoch, legs_from_state(state_dict.get("legs"))
        if yielded > len(self):
            self.epoch, self.legs = before
            raise ValueError(
                f"OwnerSampler state has yielded={yielded} but rank {self.rank}'s share holds "
                f"{len(self)} positions"
            )
        self._iter = None
        self._next_yielded = yielded

    def __len__(self) -> int:
        n = len(self._legs_pool()[1]) if self.legs else self.n_items  # mixing keeps every item
        start, stop = split.share_bounds(n, self.rank, self.world_size)
        return stop - start
