"""PyTorch readers over an :class:`~pipeline.readers.index.Index`: map-style and iterable.

Map-style: :class:`OwnerSampler` yields this rank's positions (a contiguous share, shuffled
inside), a ``BatchSampler`` groups them, the DataLoader hands each index batch to exactly one
worker, and :meth:`MapDataset.__getitems__` fetches the whole batch with one Arrow ``take`` per
part touched. Iterable: :class:`PartIterableDataset` gives each (rank, worker) owner whole parts
and streams them record batch by record batch. Both yield dict batches typed by the declared
schema (see :mod:`pipeline.readers.tensors`).
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import Dataset, IterableDataset, Sampler

from pipeline.bundle.errors import RowCountMismatch
from pipeline.bundle.verify import VerifiedSnapshot, require_verified
from pipeline.readers import split
from pipeline.readers.batches import Row
from pipeline.readers.index import Index
from pipeline.readers.owner import Owner, process_rank
from pipeline.readers.tensors import Batch, to_batch

log = logging.getLogger(__name__)


class IdleOwnerWarning(UserWarning):
    """An iterable owner got no part: there are fewer parts than (rank, worker) owners."""


def _as_index(obj: object, what: str) -> Index:
    if isinstance(obj, Index):
        return obj
    return Index.from_snapshot(require_verified(obj, what))


def _read_part(index: Index, p: int, columns: Sequence[str]) -> pa.Table:
    path, rows = index.part_paths[p], index.part_rows[p]
    table = pq.read_table(path, columns=list(columns), memory_map=True)
    if table.num_rows != rows:  # the file changed after verification
        raise RowCountMismatch(
            f"{path}: manifest says {rows} rows, found {table.num_rows}; re-verify the bundle",
            path=index.manifest.parts[p].path,
        )
    return table


class MapDataset(Dataset):
    """Random access to a verified snapshot's rows, fetched a batch at a time.

    Accepts an :class:`Index` (or a :class:`VerifiedSnapshot`, indexed on the spot); anything
    else — a path, a manifest — is refused with :class:`~pipeline.bundle.errors.NotVerified`.
    Decoded parts are cached per process (``max_cached_parts``, default all parts this process
    touches), so with :class:`OwnerSampler` a rank's workers decode only that rank's share.
    """

    def __init__(
        self,
        index: Index | VerifiedSnapshot,
        columns: Sequence[str] | None = None,
        *,
        max_cached_parts: int | None = None,
    ) -> None:
        self.index = _as_index(index, "MapDataset")
        self.columns = self.index.resolve_columns(columns)
        if max_cached_parts is not None and max_cached_parts < 1:
            raise ValueError(f"max_cached_parts must be >= 1 or None, got {max_cached_parts}")
        self.max_cached_parts = max_cached_parts
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()  # a worker decodes its own parts; never pickle tables
        return state

    def __len__(self) -> int:
        return len(self.index)

    def _part(self, p: int) -> pa.Table:
        table = self._cache.get(p)
        if table is not None:
            self._cache.move_to_end(p)
            return table
        # one chunk per column: Arrow's take over a many-chunked column concatenates it first
        table = _read_part(self.index, p, self.columns).combine_chunks()
        self._cache[p] = table
        if self.max_cached_parts is not None and len(self._cache) > self.max_cached_parts:
            self._cache.popitem(last=False)
        return table

    def take(self, positions: Sequence[int] | np.ndarray) -> pa.Table:
        """The rows at ``positions`` as one Arrow table, in the order given."""
        pos = np.asarray(positions, dtype=np.int64)
        part, row = self.index.locate(pos)
        if pos.size == 0:
            return self._part(0).slice(0, 0) if self.index.part_rows else _empty(self)
        if (part == part[0]).all():
            return self._part(int(part[0])).take(row)
        order = np.argsort(part, kind="stable")
        sorted_parts = part[order]
        cuts = np.flatnonzero(np.diff(sorted_parts)) + 1
        pieces = [self._part(int(part[g[0]])).take(row[g]) for g in np.split(order, cuts)]
        grouped = pa.concat_tables(pieces)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return grouped.take(inverse)  # back to the sampler's order

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """Fetch a whole batch: one Arrow ``take`` per part touched, then one conversion."""
        return to_batch(self.take(indices), self.index.schema, self.columns)

    def __getitem__(self, i: int) -> Row:
        """One row as a sample (tensors without the batch dimension, strings as ``str``).

        A :class:`~pipeline.readers.batches.Row`: ``collate_batches`` stacks rows into the same
        batch ``__getitems__`` would build, keeping ``list<T>`` columns as lists.
        """
        batch = to_batch(self.take([int(i)]), self.index.schema, self.columns)
        ragged = frozenset(
            c for c in self.columns if self.index.schema.field(c).type[:5] == "list<"
        )
        return Row({k: v[0] for k, v in batch.items()}, ragged)


def _empty(ds: MapDataset) -> pa.Table:
    return ds.index.schema.to_arrow().empty_table().select(ds.columns)


class OwnerSampler(Sampler[int]):
    """Yields this rank's positions: a contiguous share of the index, permuted inside.

    Unlike ``DistributedSampler`` it never pads: shares differ by at most one item and no item
    is repeated, so uneven ranks must finish with ``torch.distributed.algorithms.Join``. The
    rank comes from the arguments or the process group at construction (in the main process);
    DataLoader workers then split this rank's batches among themselves, each batch going to
    exactly one worker.
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

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order to yield; ownership does not change with it."""
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
        return iter(self.positions().tolist())

    def __len__(self) -> int:
        start, stop = split.share_bounds(self.n_items, self.rank, self.world_size)
        return stop - start


class PartIterableDataset(IterableDataset):
    """Streams the whole parts one (rank, worker) owner is assigned, a record batch at a time.

    Parts go to ranks first, balanced by rows, then to each rank's workers
    (:func:`~pipeline.readers.split.parts_by_owner`); a part is never split.
    Memory is bounded by one row group plus one batch. Batches hold exactly ``batch_size`` rows
    except an owner's last. With ``shuffle`` the order of parts, of row groups within a part
    and of rows within a row group is permuted from (seed, epoch, owner); ownership is not.
    An owner with no part warns once (:class:`IdleOwnerWarning`, naming the counts) and yields
    nothing. Use it with ``DataLoader(ds, batch_size=None, collate_fn=collate_batches)``.
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
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.index = _as_index(index, "PartIterableDataset")
        self.columns = self.index.resolve_columns(columns)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        # resolved here, in the main process: a spawned worker has no process group
        self.rank, self.world_size = process_rank(rank, world_size)
        self.epoch = 0
        self._warned: set[tuple[int, int]] = set()

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order; reaches workers started after the call (not persistent)."""
        self.epoch = epoch

    def owner(self) -> Owner:
        """The owner the calling process is: this dataset's rank and the current worker."""
        return Owner.current(self.rank, self.world_size)

    def parts_for(self, owner: Owner) -> list[int]:
        """The parts ``owner`` streams this epoch, in streaming order."""
        mine = split.assign_parts(
            self.index.part_rows, owner.index, owner.count, max(owner.num_workers, 1)
        )
        return split.part_order(
            mine, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch, owner=owner.index
        )

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_owner(self.owner())

    def iter_owner(self, owner: Owner) -> Iterator[Batch]:
        """Stream the batches ``owner`` yields (what a DataLoader worker running as it sees)."""
        if (owner.rank, owner.world_size) != (self.rank, self.world_size):
            raise ValueError(
                f"owner {owner} is not on this dataset's rank {self.rank}/{self.world_size}"
            )
        return self._stream(owner)

    def _stream(self, owner: Owner) -> Iterator[Batch]:
        parts = self.parts_for(owner)
        if not parts:
            self._warn_idle(owner)
            return
        pending: pa.Table | None = None
        for chunk in self._chunks(parts, owner):
            pending = chunk if pending is None else pa.concat_tables([pending, chunk])
            n_full = pending.num_rows // self.batch_size
            for b in range(n_full):
                yield self._convert(pending.slice(b * self.batch_size, self.batch_size))
            pending = pending.slice(n_full * self.batch_size)
        if pending is not None and pending.num_rows:
            yield self._convert(pending)

    def _convert(self, table: pa.Table) -> Batch:
        return to_batch(table, self.index.schema, self.columns)

    def _chunks(self, parts: list[int], owner: Owner) -> Iterator[pa.Table]:
        for p in parts:
            path, rows = self.index.part_paths[p], self.index.part_rows[p]
            pf = pq.ParquetFile(path, memory_map=True)
            if pf.metadata.num_rows != rows:
                raise RowCountMismatch(
                    f"{path}: manifest says {rows} rows, found {pf.metadata.num_rows}",
                    path=self.index.manifest.parts[p].path,
                )
            if not self.shuffle:
                for rb in pf.iter_batches(
                    batch_size=max(self.batch_size, 8192), columns=self.columns
                ):
                    yield pa.Table.from_batches([rb])
                continue
            rng = split.owner_rng(self.seed, self.epoch, owner.index * 100_003 + p)
            for g in rng.permutation(pf.num_row_groups):
                table = pf.read_row_group(int(g), columns=self.columns)
                yield table.take(rng.permutation(table.num_rows))

    def _warn_idle(self, owner: Owner) -> None:
        n_parts = len(self.index.part_rows)
        msg = (
            f"owner {owner.index} of {owner.count} (rank {owner.rank}/{owner.world_size}, "
            f"worker {owner.worker}/{max(owner.num_workers, 1)}) has no part to read: "
            f"{n_parts} part(s) for {owner.count} owners, so it yields nothing. Use fewer "
            "workers, more parts (stage with a smaller rows_per_part), or MapDataset"
        )
        key = (owner.index, owner.count)
        if key not in self._warned:  # once per dataset copy: per process, per epoch's workers
            self._warned.add(key)
            log.warning(msg)
            warnings.warn(msg, IdleOwnerWarning, stacklevel=2)
