"""Count what a :class:`~pipeline.readers.loader.ReaderLoader` has delivered this epoch.

Private bookkeeping behind one protocol (:class:`Progress`): a map-style epoch is one prefix of
the :class:`~pipeline.readers.sampler.OwnerSampler`'s order (:class:`MapProgress`), an
iterable one a prefix of each worker-owner's stream (:class:`IterableProgress`). The counts are
what ``ReaderLoader.state_dict()`` saves as ``rows`` and what a resumed iteration hands the
reader as its starting point.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from pipeline.readers.iterable import PartIterableDataset
from pipeline.readers.map_style import MapDataset
from pipeline.readers.reshard import Leg
from pipeline.readers.sampler import OwnerSampler, is_count


class Progress(ABC):
    """What this epoch has delivered: rows of each prefix of the reader's order, and more to come.

    One prefix for the map-style reader (the sampler's order), one per worker-owner for the
    iterable reader (its stream). ``totals`` is what a whole epoch delivers per prefix;
    ownership never depends on the epoch, so neither do they.
    """

    style: ClassVar[str]
    #: What holds the epoch and its order: the sampler, or the iterable dataset.
    reader: OwnerSampler | PartIterableDataset
    #: The dataset the workers fetch from.
    dataset: MapDataset | PartIterableDataset

    def __init__(self, totals: list[int]) -> None:
        self.totals = totals
        self.counts = [0] * len(totals)

    def advance(self, prefix: int, rows: int) -> None:
        """Count ``rows`` more rows delivered from ``prefix`` (a worker-owner, or 0)."""
        self.counts[prefix] += rows

    def left(self) -> int:
        """Rows of this epoch not yet delivered."""
        return sum(self.totals) - sum(self.counts)

    def reset(self) -> None:
        """Start the epoch over: nothing delivered."""
        self.counts = [0] * len(self.totals)

    def identity(self) -> dict[str, Any]:
        """What any state must match to resume here: the reader, its order and the bundle."""
        r, index = self.reader, self.dataset.index
        return {
            "style": self.style,
            "shuffle": r.shuffle,
            "mix": r.mix,
            "seed": r.seed,
            "items": len(index),
            "snapshot": index.snapshot_tag,
        }

    def shape(self) -> dict[str, Any]:
        """Where this loader sits in its leg: what a one-rank state must match to resume here."""
        return {"rank": self.reader.rank, "world_size": self.reader.world_size}

    @property
    def workers(self) -> int:
        """Owners per rank in this leg: 1 for the map-style reader, worker-owners for iterable."""
        return 1

    @property
    def legs(self) -> tuple[Leg, ...]:
        """This epoch's earlier legs, at other shapes (none unless resumed from a merged state)."""
        return self.reader.legs

    def _epoch_state(self) -> dict[str, Any]:
        """The reader's epoch and legs, as its own ``load_state_dict`` takes them."""
        state: dict[str, Any] = {"epoch": self.reader.epoch}
        if self.legs:
            state["legs"] = [leg.to_state() for leg in self.legs]
        return state

    @abstractmethod
    def refresh(self) -> None:
        """Recompute ``totals`` after the epoch's legs changed; nothing delivered yet."""

    def _misfit(self, rows: object, per: str, total: object) -> ValueError:
        return ValueError(
            f"loader state 'rows' {rows!r} does not fit this rank's epoch (rows per {per}: "
            f"{total!r})"
        )

    @abstractmethod
    def state(self) -> int | list[int]:
        """The state's ``rows``: what was delivered, as saved."""

    @abstractmethod
    def load(self, rows: object) -> None:
        """Take a state's ``rows`` as what was delivered; ``ValueError`` if they cannot be."""

    @abstractmethod
    def begin(self) -> None:
        """Hand the reader where this iteration starts, before its workers copy it."""

    @abstractmethod
    def started(self, num_workers: int) -> None:
        """The inner loader has started iterating (its workers, if any, with the start point)."""

    def delivered_positions(self) -> np.ndarray:
        """Index positions delivered so far this epoch, computed from the counts (no data read).

        What earlier legs delivered is counted on rank 0 only, so the ranks' positions together
        name each delivered item once.
        """
        own = self._own_positions()
        if self.legs and self.reader.rank == 0:
            return np.concatenate([self.reader.delivered_before(), own])
        return own

    @abstractmethod
    def _own_positions(self) -> np.ndarray:
        """Index positions this loader delivered in the current leg."""


class MapProgress(Progress):
    """A map-style epoch: a prefix of the :class:`OwnerSampler`'s order."""

    style = "map"
    reader: OwnerSampler
    dataset: MapDataset

    def __init__(self, sampler: OwnerSampler, dataset: MapDataset, drop_batch: int = 0) -> None:
        super().__init__([0])
        self.sampler = self.reader = sampler
        self.dataset = dataset
        self._drop_batch = drop_batch  # the inner batch size when drop_last, else 0
        self.refresh()

    def refresh(self) -> None:
        n = len(self.sampler)
        self.totals = [n - (n % self._drop_batch if self._drop_batch else 0)]
        self.reset()

    def state(self) -> int:
        return self.counts[0]

    def load(self, rows: object) -> None:
        if not (is_count(rows) and rows <= self.totals[0]):
            raise self._misfit(rows, "rank", self.totals[0])
        self.counts = [rows]

    def begin(self) -> None:
        self.sampler.load_state_dict({**self._epoch_state(), "yielded": self.counts[0]})

    def started(self, num_workers: int) -> None:
        pass  # the sampler runs in this process and has used its start point already

    def _own_positions(self) -> np.ndarray:
        return self.sampler.positions()[: self.counts[0]]


class IterableProgress(Progress):
    """An iterable epoch: a prefix of each worker-owner's stream, counted from the worker tags."""

    style = "iterable"
    reader: PartIterableDataset
    dataset: PartIterableDataset

    def __init__(self, dataset: PartIterableDataset) -> None:
        super().__init__(dataset.owner_rows())
        self.reader = self.dataset = dataset

    def refresh(self) -> None:
        self.totals = self.dataset.owner_rows()
        self.reset()

    def shape(self) -> dict[str, Any]:
        return {**super().shape(), "num_workers": self.dataset.workers}

    @property
    def workers(self) -> int:
        return self.dataset.workers or 1

    def state(self) -> list[int]:
        return list(self.counts)

    def load(self, rows: object) -> None:
        if (
            not isinstance(rows, list)
            or len(rows) != len(self.totals)
            or not all(is_count(r) and r <= t for r, t in zip(rows, self.totals, strict=True))
        ):
            raise self._misfit(rows, "worker-owner", self.totals)
        self.counts = list(rows)

    def begin(self) -> None:
        self.dataset.load_state_dict({**self._epoch_state(), "rows": list(self.counts)})

    def started(self, num_workers: int) -> None:
        if num_workers > 0:  # the workers have the resume point; this copy must not keep it
            self.dataset.load_state_dict({**self._epoch_state(), "rows": []})

    def _own_positions(self) -> np.ndarray:
        ds = self.dataset
        return np.concatenate(
            [ds.stream_positions(o, r) for o, r in zip(ds.owners(), self.counts, strict=True)]
        )
