"""Random access to a verified snapshot's rows, a batch at a time: :class:`MapDataset`.

:class:`~pipeline.readers.sampler.OwnerSampler` yields this rank's positions, a
``BatchSampler`` groups them, the DataLoader hands each index batch to exactly one worker, and
:meth:`MapDataset.__getitems__` fetches the whole batch with one Arrow ``take`` per part touched,
from parts decoded once per process (or once per rank, shared through
:mod:`~pipeline.readers.partcache`). Batches are dicts typed by the declared schema (see
:mod:`pipeline.readers.tensors`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import Dataset, get_worker_info

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import RowCountMismatch
from pipeline.bundle.verify import VerifiedSnapshot
from pipeline.readers import partcache
from pipeline.readers.batches import Row
from pipeline.readers.index import Index, as_index
from pipeline.readers.partcache import SharedParts
from pipeline.readers.tensors import (
    Batch,
    Wire,
    check_readable,
    to_wire,
    wire_to_batch,
    with_positions,
)

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
    # (see docs/readers.md, "Decode threads in workers").
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
        self.index = as_index(index, "MapDataset")
        self.columns = self.index.resolve_columns(columns)
        check_readable(self.index.schema, self.columns)  # before any part is read
        if max_cached_parts is not None and max_cached_parts < 1:
            raise ValueError(f"max_cached_parts must be >= 1 or None, got {max_cached_parts}")
        self.max_cached_parts = max_cached_parts
        self._cache: OrderedDict[int, _DecodedPart] = OrderedDict()
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
        # One chunk per column, so a batch costs one take per part touched, not one per row
        # group (see docs/readers.md, "One take per part"). A part whose strings outgrow 32-bit
        # offsets when concatenated stays in its row groups: take() handles both.
        table = _read_part(self.index, p, self.columns)
        try:
            return table.combine_chunks()
        except pa.ArrowInvalid:  # offset overflow
            return table

    def _tables(self, parts: Sequence[int]) -> dict[int, _DecodedPart]:
        """The decoded tables of ``parts`` (distinct), from this process's cache or decoded.

        In a DataLoader worker, parts not cached here come from the shared directory, decoded
        there once for all of this rank's workers; elsewhere they are decoded here.
        """
        out: dict[int, _DecodedPart] = {}
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
            self._cache[p] = out[p] = _DecodedPart(fresh[p])
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
        wire = to_wire(self.take(indices), self.index.schema, self.columns)
        return with_positions(wire, np.asarray(indices, dtype=np.int64))

    def __getitem__(self, i: int) -> Row:
        """One row as a sample (tensors without the batch dimension, strings as ``str``).

        A :class:`~pipeline.readers.batches.Row`: ``collate_batches`` stacks rows into the same
        batch ``__getitems__`` would build, keeping ``list<T>`` columns as lists.
        """
        batch = wire_to_batch(self.take_wire([int(i)]))
        ragged = frozenset(c for c in self.columns if self.index.schema.field(c).is_list)
        return Row({k: v[0] for k, v in batch.items()}, ragged)


class _DecodedPart:
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
    return [
        {
            "snapshot": index.snapshot_tag,
            "part": part.path,
            "sha256": part.sha256,
            "rows": part.rows,
            "columns": list(columns),
        }
        for part in index.manifest.parts
    ]


def _empty(ds: MapDataset) -> pa.Table:
    return ds.index.schema.to_arrow().empty_table().select(ds.columns)
