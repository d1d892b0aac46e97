"""PyTorch readers over an :class:`~pipeline.readers.index.Index`: map-style and iterable.

Map-style: :class:`OwnerSampler` yields this rank's positions (a contiguous share, shuffled
inside), a ``BatchSampler`` groups them, the DataLoader hands each index batch to exactly one
worker, and :meth:`MapDataset.__getitems__` fetches the whole batch with one Arrow ``take`` per
part touched. Iterable: :class:`PartIterableDataset` gives each (rank, worker) owner whole parts
and streams them record batch by record batch. Both yield dict batches typed by the declared
schema (see :mod:`pipeline.readers.tensors`).
"""

from __future__ import annotations

import math
import operator
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import RowCountMismatch
from pipeline.bundle.verify import VerifiedSnapshot, require_verified
from pipeline.readers import partcache, split
from pipeline.readers.batches import Row
from pipeline.readers.index import Index
from pipeline.readers.owner import Owner, agree_across_ranks, process_rank
from pipeline.readers.partcache import SharedParts
from pipeline.readers.tensors import Batch, Wire, to_wire, wire_to_batch


class IdleOwnerWarning(UserWarning):
    """An iterable owner got no part: there are fewer parts than (rank, worker) owners."""


def _as_index(obj: object, what: str) -> Index:
    if isinstance(obj, Index):
        return obj
    return Index.from_snapshot(require_verified(obj, what))


#: Result columns with a handful of distinct values by design: read dictionary-encoded (as
#: Parquet stores them), so decoding, taking and shipping them costs a small code per row, and
#: the main process makes each distinct string once per message (tensors.Coded).
CODED_COLUMNS = (fmt.STATUS_COLUMN, fmt.VERIFICATION_COLUMN)


def coded_columns(index: Index, columns: Sequence[str]) -> list[str]:
    """Which of ``columns`` the readers read dictionary-encoded (batches hold ``list[str]``)."""
    if not index.is_result:
        return []
    return [c for c in columns if c in CODED_COLUMNS and index.schema.field(c).type == "string"]


def _read_part(index: Index, p: int, columns: Sequence[str]) -> pa.Table:
    path, rows = index.part_paths[p], index.part_rows[p]
    # In a DataLoader worker, Arrow's decode threads only fight the other workers for the cores
    # (measured: the cold map-style epoch ran ~15-40% faster without them on 2 cores).
    threads = get_worker_info() is None
    coded = coded_columns(index, columns)
    table = pq.read_table(
        path,
        columns=list(columns),
        memory_map=True,
        use_threads=threads,
        read_dictionary=coded or None,
    )
    if table.num_rows != rows:  # the file changed after verification
        raise RowCountMismatch(
            f"{path}: manifest says {rows} rows, found {table.num_rows}; re-verify the bundle",
            path=index.manifest.parts[p].path,
        )
    # one dictionary per column across row groups, so row groups' rows concatenate as they are
    # and the part can be written as one Arrow IPC file (partcache)
    return table.unify_dictionaries() if coded else table


class MapDataset(Dataset):
    """Random access to a verified snapshot's rows, fetched a batch at a time.

    Accepts an :class:`Index` (or a :class:`VerifiedSnapshot`, indexed on the spot); anything
    else — a path, a manifest — is refused with :class:`~pipeline.bundle.errors.NotVerified`.
    Decoded parts are cached per process (``max_cached_parts``, default all parts this process
    touches), so with :class:`OwnerSampler` a rank's workers decode only that rank's share.

    ``share_decoded`` (default: on unless ``max_cached_parts`` bounds the cache) makes the
    DataLoader workers of the process that built the dataset share their decoded parts
    (:class:`~pipeline.readers.partcache.SharedParts`): each part is decoded once per rank and
    memory-mapped by every worker, instead of decoded and held by each. The shared directory
    lives as long as this dataset in the process that built it; ``share_decoded=False`` opts out.
    """

    def __init__(
        self,
        index: Index | VerifiedSnapshot,
        columns: Sequence[str] | None = None,
        *,
        max_cached_parts: int | None = None,
        share_decoded: bool | None = None,
    ) -> None:
        self.index = _as_index(index, "MapDataset")
        self.columns = self.index.resolve_columns(columns)
        if max_cached_parts is not None and max_cached_parts < 1:
            raise ValueError(f"max_cached_parts must be >= 1 or None, got {max_cached_parts}")
        self.max_cached_parts = max_cached_parts
        self._cache: OrderedDict[int, _Chunks] = OrderedDict()
        if share_decoded is None:
            share_decoded = max_cached_parts is None
        self.shared: SharedParts | None = None
        if share_decoded and partcache.available():
            self.shared = SharedParts(_part_tags(self.index, self.columns))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()  # a worker decodes its own parts; never pickle tables
        return state

    def __len__(self) -> int:
        return len(self.index)

    def _decode(self, p: int) -> pa.Table:
        # one chunk per column, so a batch costs one take per part touched, not one per row
        # group (measured at batch 256 in one process: 2x faster epochs; with workers, whose
        # jemalloc pool makes the copy cheap, the warm epoch ~15% faster). A part whose strings
        # outgrow 32-bit offsets when concatenated stays in its row groups: take() handles both.
        table = _read_part(self.index, p, self.columns)
        try:
            return table.combine_chunks()
        except pa.ArrowInvalid:  # offset overflow
            return table

    def _tables(self, parts: Sequence[int]) -> dict[int, _Chunks]:
        """The decoded tables of ``parts`` (distinct), from this process's cache or decoded.

        In a DataLoader worker, parts not cached here come from the shared directory, decoded
        there once for all of this rank's workers; elsewhere they are decoded here.
        """
        out: dict[int, _Chunks] = {}
        missing: list[int] = []
        for p in parts:
            table = self._cache.get(p)
            if table is None:
                missing.append(p)
            else:
                self._cache.move_to_end(p)
                out[p] = table
        if not missing:
            return out
        if self.shared is not None and get_worker_info() is not None:
            fresh = self.shared.tables(missing, self._decode)
        else:
            fresh = {p: self._decode(p) for p in missing}
        for p in missing:
            self._cache[p] = out[p] = _Chunks(fresh[p])
            if self.max_cached_parts is not None and len(self._cache) > self.max_cached_parts:
                self._cache.popitem(last=False)
        return out

    def take(self, positions: Sequence[int] | np.ndarray) -> pa.Table:
        """The rows at ``positions`` as one Arrow table, in the order given."""
        pos = np.asarray(positions, dtype=np.int64)
        part, row = self.index.locate(pos)
        if pos.size == 0:
            return _empty(self)
        needed = np.unique(part).tolist()
        # all at once: a worker decodes what no other worker is decoding
        tables = self._tables(needed)
        # each row's chunk (its part, or the part's row group where it was not combined) as
        # one key across parts, then one take per chunk
        key = np.empty_like(pos)
        base = 0
        chunks: list[pa.RecordBatch] = []
        starts: list[int] = []
        for p in needed:
            decoded = tables[p]
            mask = part == p if len(needed) > 1 else slice(None)
            c = decoded.locate(row[mask])
            key[mask] = base + c
            chunks.extend(decoded.batches)
            starts.extend(decoded.starts[:-1].tolist())
            base += len(decoded.batches)
        first = key[0]
        if (key == first).all():
            return pa.Table.from_batches([chunks[first].take(row - starts[first])])
        order = np.argsort(key, kind="stable")
        sorted_keys = key[order]
        cuts = np.flatnonzero(np.diff(sorted_keys)) + 1
        pieces = []
        for g in np.split(order, cuts):
            k = int(key[g[0]])
            pieces.append(chunks[k].take(row[g] - starts[k]))
        grouped = pa.concat_batches(pieces)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return pa.Table.from_batches([grouped.take(inverse)])  # back to the sampler's order

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """Fetch a whole batch: one Arrow ``take`` per part touched, then one conversion."""
        return wire_to_batch(self.take_wire(indices))

    def take_wire(self, indices: Sequence[int]) -> Wire:
        """The batch ``__getitems__`` returns, in its wire form (what a worker sends)."""
        return to_wire(self.take(indices), self.index.schema, self.columns)

    def __getitem__(self, i: int) -> Row:
        """One row as a sample (tensors without the batch dimension, strings as ``str``).

        A :class:`~pipeline.readers.batches.Row`: ``collate_batches`` stacks rows into the same
        batch ``__getitems__`` would build, keeping ``list<T>`` columns as lists.
        """
        batch = wire_to_batch(self.take_wire([int(i)]))
        ragged = frozenset(
            c for c in self.columns if self.index.schema.field(c).type[:5] == "list<"
        )
        return Row({k: v[0] for k, v in batch.items()}, ragged)


class _Chunks:
    """A decoded part as its record batches, located by row: one batch, or one per row group
    where the part could not be combined (see ``MapDataset._decode``)."""

    __slots__ = ("batches", "starts")

    def __init__(self, table: pa.Table) -> None:
        # zero-copy slices, aligned across columns even where their chunks are not
        self.batches = table.to_batches()
        lengths = [b.num_rows for b in self.batches]
        self.starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.starts[1:])

    def locate(self, rows: np.ndarray) -> np.ndarray:
        """The batch each of ``rows`` falls in."""
        if len(self.batches) == 1:
            return np.zeros(len(rows), dtype=np.int64)
        return np.searchsorted(self.starts, rows, side="right") - 1


def _part_tags(index: Index, columns: Sequence[str]) -> list[dict[str, Any]]:
    """What each part's shared decoded file must say it holds: snapshot, part, digest, columns."""
    ident = index.snapshot.identity
    return [
        {
            "snapshot": f"{ident.version_id}:{ident.content_sha256}",
            "part": part.path,
            "sha256": part.sha256,
            "rows": part.rows,
            "columns": list(columns),
        }
        for part in index.manifest.parts
    ]


def _empty(ds: MapDataset) -> pa.Table:
    return ds.index.schema.to_arrow().empty_table().select(ds.columns)


def _identity(index_or_len: object) -> dict[str, Any]:
    """What names the data a reader splits: the snapshot identity, or just a length."""
    if isinstance(index_or_len, (Index, MapDataset)):
        ix = index_or_len if isinstance(index_or_len, Index) else index_or_len.index
        ident = ix.snapshot.identity
        return {"items": len(ix), "snapshot": f"{ident.version_id}:{ident.content_sha256}"}
    return {"items": int(index_or_len)}  # type: ignore[call-overload]


def _state_int(state: Mapping[str, Any], key: str, what: str) -> int:
    value = state.get(key) if isinstance(state, Mapping) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} state needs {key!r} as an int >= 0, found {value!r}")
    return value


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
    the order, never by drawing the skipped positions. A prefetching DataLoader draws positions
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
    ) -> None:
        self.n_items = index_or_len if isinstance(index_or_len, int) else len(index_or_len)
        self.rank, self.world_size = process_rank(rank, world_size)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._next_yielded: int | None = None  # where the next __iter__ starts (resume)
        self._iter: Iterator[int] | None = None  # the current iterator, to count what it yielded
        self._iter_start = 0
        self._iter_len = 0
        agree_across_ranks(
            "OwnerSampler",
            {
                **_identity(index_or_len),
                "world_size": self.world_size,
                "shuffle": shuffle,
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
        self.epoch = epoch

    def positions(self) -> np.ndarray:
        """This epoch's positions as an array (what ``__iter__`` yields)."""
        return split.map_positions(
            self.n_items,
            self.rank,
            self.world_size,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=self.epoch,
        )

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

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "yielded"}``: plain ints, JSON-ready."""
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make the next iteration yield epoch ``state_dict["epoch"]`` from ``yielded`` on."""
        epoch = _state_int(state_dict, "epoch", "OwnerSampler")
        yielded = _state_int(state_dict, "yielded", "OwnerSampler")
        if yielded > len(self):
            raise ValueError(
                f"OwnerSampler state has yielded={yielded} but rank {self.rank}'s share holds "
                f"{len(self)} positions"
            )
        self.epoch = epoch
        self._iter = None
        self._next_yielded = yielded

    def __len__(self) -> int:
        start, stop = split.share_bounds(self.n_items, self.rank, self.world_size)
        return stop - start


class PartIterableDataset(IterableDataset):
    """Streams the whole parts one (rank, worker) owner is assigned, a record batch at a time.

    Parts go to ranks first, balanced by rows, then to each rank's workers
    (:func:`~pipeline.readers.split.parts_by_owner`); a part is never split. Memory is bounded
    by one row group plus one batch. An owner's batches are cut every ``batch_size`` rows of its
    stream, so all are full except its last. With ``shuffle`` the order of parts, of row groups
    within a part and of rows within a row group is permuted from (seed, epoch, owner);
    ownership is not. Use it with ``DataLoader(ds, batch_size=None, collate_fn=collate_batches)``.

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
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers is not None and num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 or None, got {num_workers}")
        self.index = _as_index(index, "PartIterableDataset")
        self.columns = self.index.resolve_columns(columns)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_workers = num_workers
        # resolved here, in the main process: a spawned worker has no process group
        self.rank, self.world_size = process_rank(rank, world_size)
        self.epoch = 0
        self._resume: list[int] | None = None  # rows per worker-owner the next iteration skips
        self._progress: dict[int, int] = {}  # rows yielded per worker-owner iterated here
        self._warned: set[tuple[int, int]] = set()
        agree_across_ranks(
            "PartIterableDataset",
            {
                **_identity(self.index),
                "parts": len(self.index.part_rows),
                "world_size": self.world_size,
                "num_workers": num_workers,
                "shuffle": shuffle,
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

    def parts_for(self, owner: Owner) -> list[int]:
        """The parts ``owner`` streams this epoch, in streaming order."""
        mine = split.assign_parts(
            self.index.part_rows, owner.index, owner.count, max(owner.num_workers, 1)
        )
        return split.part_order(
            mine, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch, owner=owner.index
        )

    def owner_rows(self) -> list[int]:
        """Rows each of this rank's owners streams per epoch (needs ``num_workers``)."""
        rows = self.index.part_rows
        return [sum(rows[p] for p in self.parts_for(o)) for o in self.owners()]

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch, over all its workers."""
        return sum(math.ceil(r / self.batch_size) for r in self.owner_rows())

    # -- epochs and resuming --------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order; reaches workers started after the call (not persistent).

        A resume point loaded for another epoch is dropped: it named rows of that epoch.
        """
        if epoch != self.epoch:
            self._resume = None
            self._progress = {}
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
        return {"epoch": self.epoch, "rows": [self._progress.get(w, base[w]) for w in range(n)]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make each owner of the next iteration of ``state_dict["epoch"]`` start at its rows."""
        epoch = _state_int(state_dict, "epoch", "PartIterableDataset")
        rows = state_dict.get("rows")
        if not isinstance(rows, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rows
        ):
            raise ValueError(
                f"PartIterableDataset state needs 'rows' as a list of ints >= 0, found {rows!r}"
            )
        if self.workers is not None and rows and len(rows) != self.workers:
            raise ValueError(
                f"PartIterableDataset state holds rows for {len(rows)} worker-owner(s), but this "
                f"dataset has {self.workers} (num_workers={self.num_workers}): ownership differs"
            )
        self.epoch = epoch
        self._progress = {}
        self._resume = list(rows)

    def stream_positions(self, owner: Owner, stop: int | None = None) -> np.ndarray:
        """Index positions of ``owner``'s stream this epoch, in order (its first ``stop``).

        Computed from the split, the seed and the Parquet footers (row group sizes); no data is
        read. With a state's ``rows[w]`` as ``stop`` it names exactly what owner ``w`` delivered.
        """
        rows = self.index.part_rows
        out: list[np.ndarray] = []
        left = sum(rows[p] for p in self.parts_for(owner)) if stop is None else stop
        for p in self.parts_for(owner):
            if left <= 0:
                break
            start = int(self.index.part_offsets[p])
            if not self.shuffle or rows[p] == 0:
                out.append(np.arange(start, start + min(rows[p], left), dtype=np.int64))
                left -= rows[p]
                continue
            meta = pq.ParquetFile(self.index.part_paths[p], memory_map=True).metadata
            bounds = np.zeros(meta.num_row_groups + 1, dtype=np.int64)
            np.cumsum(
                [meta.row_group(g).num_rows for g in range(meta.num_row_groups)], out=bounds[1:]
            )
            groups = split.row_group_order(
                meta.num_row_groups,
                shuffle=True,
                seed=self.seed,
                epoch=self.epoch,
                owner=owner.index,
                part=p,
            )
            for g in groups:
                if left <= 0:
                    break
                g = int(g)
                n = int(bounds[g + 1] - bounds[g])
                order = split.row_order(
                    n, seed=self.seed, epoch=self.epoch, owner=owner.index, part=p, group=g
                )
                out.append(start + bounds[g] + order[:left])
                left -= n
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    # -- streaming ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return map(wire_to_batch, self.iter_wire())

    def iter_wire(self) -> Iterator[Wire]:
        """The batches ``__iter__`` yields, in their wire form (what a worker sends)."""
        return self.iter_owner(self.owner(), wire=True)

    def iter_owner(self, owner: Owner, *, wire: bool = False) -> Iterator[Batch | Wire]:
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
        parts = self.parts_for(owner)
        if not parts:
            if self.num_workers is None:  # else it was said once, at construction
                self._warn_idle(owner)
            return
        total = sum(self.index.part_rows[p] for p in parts)
        if start > total:
            raise ValueError(
                f"resume point {start} is past the {total} rows owner {owner.index} streams"
            )
        bs = self.batch_size
        pos = start  # rows of this owner's stream before ``pending``
        pending: pa.Table | None = None
        for chunk in self._chunks(parts, owner, start):
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
        return to_wire(table, self.index.schema, self.columns)

    def _chunks(self, parts: list[int], owner: Owner, skip: int) -> Iterator[pa.Table]:
        """The owner's rows as tables, in stream order, from row ``skip`` of its stream on."""
        coded = coded_columns(self.index, self.columns)
        for p in parts:
            path, rows = self.index.part_paths[p], self.index.part_rows[p]
            if skip and skip >= rows:  # consumed before the resume point: not even opened
                skip -= rows
                continue
            pf = pq.ParquetFile(path, memory_map=True, read_dictionary=coded or None)
            if pf.metadata.num_rows != rows:
                raise RowCountMismatch(
                    f"{path}: manifest says {rows} rows, found {pf.metadata.num_rows}",
                    path=self.index.manifest.parts[p].path,
                )
            groups = split.row_group_order(
                pf.num_row_groups,
                shuffle=self.shuffle,
                seed=self.seed,
                epoch=self.epoch,
                owner=owner.index,
                part=p,
            )
            sizes = [pf.metadata.row_group(int(g)).num_rows for g in groups]
            first = 0
            while skip and skip >= sizes[first]:  # whole row groups before the point: unread
                skip -= sizes[first]
                first += 1
            if not self.shuffle:
                for rb in pf.iter_batches(
                    batch_size=max(self.batch_size, 8192),
                    row_groups=[int(g) for g in groups[first:]],
                    columns=self.columns,
                ):
                    if skip >= rb.num_rows:
                        skip -= rb.num_rows
                        continue
                    table = pa.Table.from_batches([rb])
                    yield table.slice(skip) if skip else table
                    skip = 0
                continue
            for g in groups[first:]:
                g = int(g)
                table = pf.read_row_group(g, columns=self.columns)
                order = split.row_order(
                    table.num_rows,
                    seed=self.seed,
                    epoch=self.epoch,
                    owner=owner.index,
                    part=p,
                    group=g,
                )
                yield table.take(order[skip:] if skip else order)
                skip = 0

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
