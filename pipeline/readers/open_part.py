"""Reading an iterable stream's plan: the part file it is in (opened when first needed, and
checked), its segments, and the lanes of a mixed stream interleaved."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.bundle.errors import RowCountMismatch
from pipeline.readers import mix
from pipeline.readers.index import Index
from pipeline.readers.stream import Segment, Unit
from pipeline.readers.tensors import POSITION_KEY


class OpenPart:
    """The part a stream is reading: opened once, when the plan first needs it, and checked."""

    def __init__(self, index: Index, coded: list[str]) -> None:
        self._index = index
        self._coded = coded
        self._part = -1
        self._file: pq.ParquetFile | None = None

    def open(self, p: int) -> pq.ParquetFile:
        """Part ``p``'s Parquet file, refused if its row count is not the manifest's."""
        if self._file is None or self._part != p:
            path, rows = self._index.part_paths[p], self._index.part_rows[p]
            pf = pq.ParquetFile(path, memory_map=True, read_dictionary=self._coded or None)
            if pf.metadata.num_rows != rows:  # the file changed after verification
                raise RowCountMismatch(
                    f"{path}: manifest says {rows} rows, found {pf.metadata.num_rows}",
                    path=self._index.manifest.parts[p].path,
                )
            self._part, self._file = p, pf
        return self._file

    def group_rows(self, p: int) -> list[int]:
        """Rows per row group of part ``p``, from its footer."""
        meta = self.open(p).metadata
        return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]

    def segment(self, seg: Segment, columns: Sequence[str], batch_size: int) -> Iterator[pa.Table]:
        """A segment's rows as tables, in its order: a whole part a record batch at a time, or
        its row group decoded once and taken in the permuted order. Each table carries its rows'
        index positions as a last column, :data:`~pipeline.readers.tensors.POSITION_KEY`, which
        slicing, concatenating and interleaving keep beside the rows they describe."""
        pf = self.open(seg.part)
        order = seg.order()
        path = self._index.manifest.parts[seg.part].path
        positions = order + (int(self._index.part_offsets[seg.part]) + seg.first)
        if seg.group is not None:
            group = pf.read_row_group(seg.group, columns=columns)
            yield _positioned(group.take(order), positions, path)
            return
        skip, first = seg.skip, 0
        while skip and skip >= pf.metadata.row_group(first).num_rows:  # unread row groups
            skip -= pf.metadata.row_group(first).num_rows
            first += 1
        groups = list(range(first, pf.num_row_groups))
        done = 0
        for rb in pf.iter_batches(
            batch_size=max(batch_size, 8192), row_groups=groups, columns=columns
        ):
            if skip >= rb.num_rows:
                skip -= rb.num_rows
                continue
            table = pa.Table.from_batches([rb])
            table = table.slice(skip) if skip else table
            skip = 0
            yield _positioned(table, positions[done : done + table.num_rows], path)
            done += table.num_rows


def _positioned(table: pa.Table, positions: np.ndarray, path: str) -> pa.Table:
    if len(positions) != table.num_rows:  # the plan and the file disagree: never mislabel rows
        raise RowCountMismatch(
            f"a stream segment holds {table.num_rows} rows where its plan names {len(positions)}",
            path=path,
        )
    return table.append_column(POSITION_KEY, pa.array(positions, pa.int64()))


def read_lanes(
    index: Index,
    lanes: Sequence[Sequence[Unit]],
    start: int,
    coded: list[str],
    columns: Sequence[str],
) -> Iterator[pa.Table]:
    """A mixed owner's rows from row ``start`` of its stream on: its lanes, interleaved row by
    row (:func:`pipeline.readers.mix.interleave`), one open part and row group per lane."""
    firsts = mix.lane_starts([sum(u.rows for u in lane) for lane in lanes], start)
    streams = [
        _lane(index, lane, first, coded, columns) for lane, first in zip(lanes, firsts, strict=True)
    ]
    return mix.interleave(streams, firsts, _num_rows, _slice, _merge)


def _lane(
    index: Index, lane: Sequence[Unit], skip: int, coded: list[str], columns: Sequence[str]
) -> Iterator[pa.Table]:
    files = OpenPart(index, coded)
    for seg in mix.lane_segments(lane, skip):
        yield from files.segment(seg, columns, 0)


def _num_rows(table: pa.Table) -> int:
    return table.num_rows


def _slice(table: pa.Table, a: int, b: int) -> pa.Table:
    return table.slice(a, b - a)


def _merge(tables: list[pa.Table], order: np.ndarray) -> pa.Table:
    return pa.concat_tables(tables).take(order)
