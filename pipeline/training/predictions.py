"""A trainer's predictions written to one Parquet file as they come, in row groups.

``Trainer.predict`` returns a ``pa.Table``, or a ``pa.RecordBatchReader`` for a table too large
to hold (the reference trainer streams: one batch per loader batch). :func:`write_predictions`
takes either, checks the id column is there before anything is written, and writes row groups
of :data:`~pipeline.bundle.writer.ROW_GROUP_ROWS` rows under a temporary name, renamed into
place once whole: a prediction file is complete or absent. A thread writes each row group while
the stream computes the next, so its memory is two row groups, whatever the number of items.
Statuses are counted on the way through, so nothing reads the file again to describe it.
Downstream, :class:`PredictionFile` reads one column, or streams the batches (into a staged
bundle), without loading the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import atomic_path
from pipeline.bundle.writer import ROW_GROUP_ROWS
from pipeline.training.trainer import TrainerError


@dataclass(frozen=True)
class PredictionFile:
    """A prediction table on disk: where it is, its rows, and the counts written with it."""

    path: Path
    rows: int
    id_field: str
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def schema(self) -> pa.Schema:
        return pq.read_schema(self.path)

    def column(self, name: str) -> pa.ChunkedArray:
        """One column, read alone (the others are never decoded)."""
        return pq.read_table(self.path, columns=[name]).column(name)

    def iter_batches(self, batch_size: int = ROW_GROUP_ROWS) -> Iterator[pa.RecordBatch]:
        """Every row, in order, a batch at a time."""
        yield from pq.ParquetFile(self.path).iter_batches(batch_size=batch_size)

    def read(self) -> pa.Table:
        """The whole table in memory: for small tables and for callers that want one."""
        return pq.read_table(self.path)


def write_predictions(
    result: object, path: str | Path, *, id_field: str, trainer: str
) -> PredictionFile:
    """Write what ``trainer``'s ``predict`` returned (``result``) to ``path`` as Parquet.

    Raises :class:`TrainerError` (naming ``trainer``) for anything but a table or a record batch
    reader, or for one without the id column; nothing is left at ``path`` then.
    """
    reader = _reader(result, trainer)
    if id_field not in reader.schema.names:
        raise TrainerError(
            f"{trainer}.predict returned columns {reader.schema.names}: no id column "
            f"{id_field!r}, so no row can be matched to an item"
        )
    path = Path(path)
    rows = 0
    by_status: dict[str, int] = {}
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    writing: Future | None = None
    # The pool is left (its write waited for) before the writer closes, and the writer before
    # the temporary file is renamed or removed.
    with (
        atomic_path(path) as tmp,
        pq.ParquetWriter(tmp, reader.schema) as writer,
        ThreadPoolExecutor(1, thread_name_prefix="predictions-writer") as pool,
    ):

        def flush() -> None:
            """Hand the pending rows to the writer thread as one row group, once it is done
            with the one before: the stream's next batches are computed while it encodes and
            compresses (Arrow's writer lets go of the GIL), and its errors surface here."""
            nonlocal pending, pending_rows, writing
            if pending:
                table = pa.Table.from_batches(pending, reader.schema)
                pending, pending_rows = [], 0
                if writing is not None:
                    writing.result()
                writing = pool.submit(writer.write_table, table)

        for batch in reader:
            if fmt.STATUS_COLUMN in batch.schema.names:
                counted, _ = fmt.count_statuses(batch.column(fmt.STATUS_COLUMN))
                for name, n in counted.items():
                    by_status[name] = by_status.get(name, 0) + n
            rows += batch.num_rows
            pending.append(batch)
            pending_rows += batch.num_rows
            if pending_rows >= ROW_GROUP_ROWS:
                flush()
        flush()
        if writing is not None:
            writing.result()
    return PredictionFile(path=path, rows=rows, id_field=id_field, by_status=by_status)


def _reader(result: object, trainer: str) -> pa.RecordBatchReader:
    if isinstance(result, pa.Table):
        return pa.RecordBatchReader.from_batches(
            result.schema, result.to_batches(max_chunksize=ROW_GROUP_ROWS)
        )
    if isinstance(result, pa.RecordBatchReader):
        return result
    raise TrainerError(
        f"{trainer}.predict returned {type(result).__name__}, expected a pa.Table or a "
        "pa.RecordBatchReader"
    )
