"""Stream whole parts to each (rank, worker) owner, batch by batch: :class:`PartIterableDataset`.

The row order an owner streams is planned by :mod:`pipeline.readers.stream` (whole
parts, then row groups and rows permuted when shuffling); this module reads that plan from the
Parquet files, cuts it into batches and keeps the per-owner resume state, including the earlier
legs of an epoch resumed at another shape (:mod:`pipeline.readers.reshard`). Batches are dicts
typed by the declared schema (see :mod:`pipeline.readers.tensors`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np
import pyarrow as pa
from torch.utils.data import IterableDataset

from pipeline.bundle.verify import VerifiedSnapshot
from pipeline.readers import mix as mixing
from pipeline.readers import stream
from pipeline.readers.index import Index, as_index
from pipeline.readers.map_style import coded_columns
from pipeline.readers.open_part import OpenPart, read_lanes
from pipeline.readers.owner import Owner, agree_across_ranks, process_rank
from pipeline.readers.reshard import Leg, iterable_pool, legs_from_state
from pipeline.readers.sampler import is_count, state_count
from pipeline.readers.tensors import (
    POSITION_KEY,
    Batch,
    Wire,
    check_readable,
    to_wire,
    wire_to_batch,
    with_positions,
)


class IdleOwnerWarning(UserWarning):
    """An iterable owner got no part: there are fewer parts than (rank, worker) owners."""


class PartIterableDataset(IterableDataset):
    """Streams the whole parts one (rank, worker) owner is assigned, a record batch at a time.

    Parts go to ranks first, balanced by rows, then to each rank's workers
    (:func:`~pipeline.readers.split.parts_by_owner`); a part is never split. Memory is bounded
    by one row group plus one batch. An owner's batches are cut every ``batch_size`` rows of its
    stream, so all are full except its last. With ``shuffle`` the order of parts, of row groups
    within a part and of rows within a row group is permuted from (seed, epoch, owner)
    (:func:`~pipeline.readers.stream.owner_stream`); ownership is not. Use it with
    ``DataLoader(ds, batch_size=None, collate_fn=collate_batches)``.

    ``num_workers`` declares the DataLoader's worker count (:func:`make_loader` passes it). With
    it the dataset knows its owners in the main process: ``len()`` is the epoch's batch count,
    owners with no part warn once here (:class:`IdleOwnerWarning`), ranks compare it with the
    other split parameters, and a worker of a DataLoader with another worker count refuses to
    run. Without it each worker learns the count from ``get_worker_info()`` and an idle one warns
    in its own process.

    Resumable: :meth:`state_dict` is ``{"epoch", "rows"}``, ``rows`` holding for each of this
    rank's worker-owners how many rows of its stream were yielded; :meth:`load_state_dict` makes
    each owner of the next iteration of that epoch start there. Whole parts and row groups before
    the point are skipped unread; only the row group holding it is decoded again.
    """

    def __init__(
        self,
        index: Index | VerifiedSnapshot,
        *,
        batch_size: int,
        columns: Sequence[str] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int | None = None,
        mix: bool = False,
    ) -> None:
        if mix and not shuffle:
            raise ValueError("mix=True is a shuffle: it needs shuffle=True")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers is not None and num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 or None, got {num_workers}")
        self.index = as_index(index, "PartIterableDataset")
        self.columns = self.index.resolve_columns(columns)
        check_readable(self.index.schema, self.columns)  # before any part is read
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.mix = mix
        self.seed = seed
        self.num_workers = num_workers
        # resolved here, in the main process: a spawned worker has no process group
        self.rank, self.world_size = process_rank(rank, world_size)
        self.epoch = 0
        self._resume: list[int] | None = None  # rows per worker-owner the next iteration skips
        self._progress: dict[int, int] = {}  # rows yielded per worker-owner iterated here
        self._warned: set[tuple[int, int]] = set()
        self.legs: tuple[Leg, ...] = ()  # earlier legs of this epoch, at other shapes
        self._pool: tuple[tuple[int, tuple[Leg, ...]], list[stream.Unit]] | None = None
        agree_across_ranks(
            "PartIterableDataset",
            {
                "items": len(self.index),
                "snapshot": self.index.snapshot_tag,
                "parts": len(self.index.part_rows),
                "world_size": self.world_size,
                "num_workers": num_workers,
                "shuffle": shuffle,
                "mix": mix,
                "seed": seed,
            },
            self.rank,
            self.world_size,
        )
        if num_workers is not None:
            for owner in self.owners():
                if not self.parts_for(owner):
                    self._warn_idle(owner)

    # -- who reads what -------------------------------------------------------------------
    @property
    def workers(self) -> int | None:
        """Worker-owners per rank (``max(num_workers, 1)``), or None if not declared."""
        return None if self.num_workers is None else max(self.num_workers, 1)

    def owners(self) -> list[Owner]:
        """This rank's owners, one per declared worker (needs ``num_workers``)."""
        if self.num_workers is None:
            raise TypeError(
                "this PartIterableDataset does not know its DataLoader's worker count; build it "
                "with num_workers= (make_loader does)"
            )
        return [
            Owner(self.rank, self.world_size, w, self.num_workers)
            for w in range(max(self.num_workers, 1))
        ]

    def owner(self) -> Owner:
        """The owner the calling process is: this dataset's rank and the current worker."""
        owner = Owner.current(self.rank, self.world_size)
        self._check_declared(owner)
        return owner

    def _check_declared(self, owner: Owner) -> None:
        if self.workers is not None and max(owner.num_workers, 1) != self.workers:
            raise ValueError(
                f"PartIterableDataset was built for num_workers={self.num_workers} (the split "
                f"the ranks agreed on) but runs as worker {owner.worker} of "
                f"{owner.num_workers}: build the DataLoader with num_workers={self.num_workers}"
            )

    def _units(self) -> list[stream.Unit] | None:
        """What this leg of the epoch splits: None for every whole part (an unmixed first leg)."""
        if not self.legs and not self.mix:
            return None
        key = (self.epoch, self.legs)
        if self._pool is None or self._pool[0] != key:
            _, units = self._legs_pool()
            self._pool = (key, units)
        return self._pool[1]

    def lanes_for(self, owner: Owner) -> list[list[stream.Unit]]:
        """The lanes of row group units ``owner`` interleaves this epoch (``mix`` only)."""
        pool = self._units()
        assert pool is not None and self.mix
        return mixing.owner_lanes(
            pool,
            owner.index,
            owner.count,
            max(owner.num_workers, 1),
            seed=self.seed,
            epoch=self.epoch,
            leg=len(self.legs),
        )

    def units_for(self, owner: Owner) -> list[stream.Unit]:
        """What ``owner`` streams this epoch (whole parts, or the rest of begun ones), in order."""
        if self.mix:
            return [u for lane in self.lanes_for(owner) for u in lane]
        pool = self._units()
        return stream.owner_units(
            stream.whole_parts(self.index.part_rows) if pool is None else pool,
            owner.index,
            owner.count,
            max(owner.num_workers, 1),
            self._order(),
        )

    def _order(self) -> stream.LegOrder:
        return stream.LegOrder(self.shuffle, self.seed, self.epoch, len(self.legs))

    def parts_for(self, owner: Owner) -> list[int]:
        """The parts ``owner`` streams this epoch, in streaming order."""
        return [u.part for u in self.units_for(owner)]

    def owner_rows(self) -> list[int]:
        """Rows each of this rank's owners streams this epoch (needs ``num_workers``)."""
        return [sum(u.rows for u in self.units_for(o)) for o in self.owners()]

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch, over all its workers."""
        return sum(math.ceil(r / self.batch_size) for r in self.owner_rows())

    def _plan(self, owner: Owner, start: int, files: OpenPart) -> Iterator[stream.Segment]:
        """``owner``'s stream this epoch from its row ``start`` on (the one order there is)."""
        key = self._order().key(owner.index)
        return stream.owner_segments(self.units_for(owner), files.group_rows, key, start)

    # -- epochs and resuming --------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order; reaches workers started after the call (not persistent).

        A resume point loaded for another epoch is dropped: it named rows of that epoch.
        """
        if epoch != self.epoch:
            self._resume = None
            self._progress = {}
            self.legs = ()  # they named rows of that epoch
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "rows"}``: per worker-owner, the rows of its stream yielded this epoch.

        Counted where the dataset iterates: in the main process with ``num_workers=0``, in each
        worker's copy otherwise (so torchdata's ``StatefulDataLoader`` can snapshot it there).
        An owner not iterated here shows its resume point (0 if none).
        """
        base = list(self._resume or [])
        n = max(self.workers or 0, len(base), max(self._progress, default=-1) + 1)
        base += [0] * (n - len(base))
        state: dict[str, Any] = {
            "epoch": self.epoch,
            "rows": [self._progress.get(w, base[w]) for w in range(n)],
        }
        if self.legs:
            state["legs"] = [leg.to_state() for leg in self.legs]
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make each owner of the next iteration of ``state_dict["epoch"]`` start at its rows."""
        epoch = state_count(state_dict, "epoch", "PartIterableDataset")
        rows = state_dict.get("rows")
        if not isinstance(rows, list) or not all(is_count(r) for r in rows):
            raise ValueError(
                f"PartIterableDataset state needs 'rows' as a list of ints >= 0, found {rows!r}"
            )
        if self.workers is not None and rows and len(rows) != self.workers:
            raise ValueError(
                f"PartIterableDataset state holds rows for {len(rows)} worker-owner(s), but this "
                f"dataset has {self.workers} (num_workers={self.num_workers}): ownership differs"
            )
        self.epoch = epoch
        self.legs = legs_from_state(state_dict.get("legs"))
        self._progress = {}
        self._resume = list(rows)

    def stream_positions(self, owner: Owner, stop: int | None = None) -> np.ndarray:
        """Index positions of ``owner``'s stream this epoch, in order (its first ``stop``).

        Computed from the split, the seed and the Parquet footers (row group sizes); no data is
        read. With a state's ``rows[w]`` as ``stop`` it names exactly what owner ``w`` delivered.
        """
        if self.mix:
            return mixing.lane_positions(self.lanes_for(owner), self.index.part_offsets, 0, stop)
        plan = self._plan(owner, 0, OpenPart(self.index, []))
        return stream.stream_positions(plan, self.index.part_offsets, stop)

    def delivered_before(self) -> np.ndarray:
        """Index positions this epoch's earlier legs delivered (every rank alike; none if none)."""
        if not self.legs:
            return np.zeros(0, dtype=np.int64)
        return self._legs_pool(self.index.part_offsets)[0]

    def _legs_pool(
        self, part_offsets: np.ndarray | None = None
    ) -> tuple[np.ndarray, list[stream.Unit]]:
        order: dict[str, Any] = dict(
            shuffle=self.shuffle, seed=self.seed, epoch=self.epoch, mix=self.mix
        )
        group_rows = OpenPart(self.index, []).group_rows
        return iterable_pool(
            self.index.part_rows, group_rows, self.legs, **order, part_offsets=part_offsets
        )

    # -- streaming ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return map(wire_to_batch, self.iter_wire())

    def iter_wire(self) -> Iterator[Wire]:
        """The batches ``__iter__`` yields, in their wire form (what a worker sends)."""
        return self.iter_owner(self.owner(), wire=True)

    @overload
    def iter_owner(self, owner: Owner, *, wire: Literal[False] = ...) -> Iterator[Batch]: ...
    @overload
    def iter_owner(self, owner: Owner, *, wire: Literal[True]) -> Iterator[Wire]: ...
    def iter_owner(self, owner: Owner, *, wire: bool = False) -> Iterator[Batch] | Iterator[Wire]:
        """Stream the batches ``owner`` yields (what a DataLoader worker running as it sees).

        ``wire=True`` yields them in their :class:`~pipeline.readers.tensors.Wire` form.
        """
        if (owner.rank, owner.world_size) != (self.rank, self.world_size):
            raise ValueError(
                f"owner {owner} is not on this dataset's rank {self.rank}/{self.world_size}"
            )
        self._check_declared(owner)
        start = 0
        if self._resume:
            if len(self._resume) != max(owner.num_workers, 1):
                raise ValueError(
                    f"the resume state holds rows for {len(self._resume)} worker-owner(s) but "
                    f"this DataLoader runs {max(owner.num_workers, 1)}: ownership differs"
                )
            start = self._resume[owner.worker]
            self._resume[owner.worker] = 0  # a resume point is used once
        self._progress[owner.worker] = start
        stream = self._stream(owner, start)
        return stream if wire else map(wire_to_batch, stream)

    def _stream(self, owner: Owner, start: int) -> Iterator[Wire]:
        if not self.parts_for(owner):
            if self.num_workers is None:  # else it was said once, at construction
                self._warn_idle(owner)
            return
        bs = self.batch_size
        pos = start  # rows of this owner's stream before ``pending``
        pending: pa.Table | None = None
        for chunk in self._read(owner, start):
            pending = chunk if pending is None else pa.concat_tables([pending, chunk])
            # cuts fall every batch_size rows of the owner's stream, wherever it (re)started
            first = bs - pos % bs
            if pending.num_rows < first:
                continue
            cuts = [0, *range(first, pending.num_rows + 1, bs)]
            for a, b in zip(cuts, cuts[1:], strict=False):
                self._progress[owner.worker] = pos + b
                yield self._convert(pending.slice(a, b - a))
            pos += cuts[-1]
            pending = pending.slice(cuts[-1])
        if pending is not None and pending.num_rows:
            self._progress[owner.worker] = pos + pending.num_rows
            yield self._convert(pending)

    def _convert(self, table: pa.Table) -> Wire:
        wire = to_wire(table, self.index.schema, self.columns)
        return with_positions(wire, table.column(POSITION_KEY))

    def _read(self, owner: Owner, start: int) -> Iterator[pa.Table]:
        """The owner's rows as tables, from row ``start`` of its stream on, as planned."""
        coded = coded_columns(self.index, self.columns)
        if self.mix:
            yield from read_lanes(self.index, self.lanes_for(owner), start, coded, self.columns)
            return
        files = OpenPart(self.index, coded)
        for seg in self._plan(owner, start, files):
            yield from files.segment(seg, self.columns, self.batch_size)

    def _warn_idle(self, owner: Owner) -> None:
        key = (owner.index, owner.count)
        if key in self._warned:
            return
        self._warned.add(key)
        n_parts = len(self.index.part_rows)
        warnings.warn(
            f"owner {owner.index} of {owner.count} (rank {owner.rank}/{owner.world_size}, "
            f"worker {owner.worker}/{max(owner.num_workers, 1)}) has no part to read: "
            f"{n_parts} part(s) for {owner.count} owners, so it yields nothing. Use fewer "
            "workers, more parts (stage with a smaller rows_per_part), or MapDataset",
            IdleOwnerWarning,
            stacklevel=3,
        )
