"""The files of a bundle being staged: parts written, linked or copied, and the outstanding list.

Every file is written once, flushed, hashed once and made read-only; its fingerprint is kept so
that the verification before publishing does not hash it a second time. Rows are regrouped
before writing, so a part's bytes (and so ``content_sha256``) depend only on the content and the
rows per part, never on how the caller happened to batch the stream.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import READ_ONLY, fsync_file
from pipeline.bundle.digest import sha256_file
from pipeline.bundle.errors import IdentifierError
from pipeline.bundle.fingerprint import Fingerprint
from pipeline.bundle.manifest import FileEntry

#: Rows per row group: the iterable reader's memory bound is one row group of one part.
ROW_GROUP_ROWS = 65_536


@dataclass(frozen=True)
class ReusedPart:
    """A part of an earlier bundle to bind again: hard-linked into the new one, never rewritten."""

    bundle: Path
    entry: FileEntry


def link_parts(tmp: Path, reuse: Sequence[ReusedPart]) -> list[FileEntry]:
    """Bind ``reuse`` as the first parts: hard links, or one copy across file systems."""
    entries = []
    for i, r in enumerate(reuse):
        rel = fmt.part_path(i)
        try:
            os.link(r.bundle / r.entry.path, tmp / rel)
        except OSError:  # another file system: copy once
            shutil.copyfile(r.bundle / r.entry.path, tmp / rel)
            fsync_file(tmp / rel)
            os.chmod(tmp / rel, READ_ONLY)
        entries.append(
            FileEntry(path=rel, sha256=r.entry.sha256, bytes=r.entry.bytes, rows=r.entry.rows)
        )
    return entries


class PartWriter:
    """Writes batches as parts of ``rows_per_part`` rows, in row groups of ``ROW_GROUP_ROWS``.

    At most one row group is buffered. Each finished part is flushed, hashed once and made
    read-only; its entry is in :attr:`entries`, its fingerprint in ``hashed``. Used as a context
    manager: leaving it normally finishes the last part; an error only releases the open file.
    """

    def __init__(
        self,
        tmp: Path,
        target: pa.Schema,
        rows_per_part: int,
        first: int,
        hashed: dict[str, Fingerprint],
    ) -> None:
        self._tmp, self._target, self._rows_per_part = tmp, target, rows_per_part
        self._first, self._hashed = first, hashed
        self.entries: list[FileEntry] = []
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._rows_in_part = 0

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self._close_part()
        elif self._writer is not None:  # release the file; the staging directory is removed
            with contextlib.suppress(Exception):
                self._writer.close()

    def write(self, batch: pa.RecordBatch, on_rows: Callable[[int], None] | None) -> None:
        """Add a conformed batch; ``on_rows`` hears of every slice taken from it."""
        offset = 0
        while offset < batch.num_rows:
            take = min(
                self._rows_per_part - self._rows_in_part,
                ROW_GROUP_ROWS - self._pending_rows,
                batch.num_rows - offset,
            )
            self._pending.append(batch.slice(offset, take))
            self._pending_rows += take
            self._rows_in_part += take
            offset += take
            if on_rows is not None:
                on_rows(take)
            if self._rows_in_part == self._rows_per_part:
                self._close_part()
            elif self._pending_rows == ROW_GROUP_ROWS:
                self._flush()

    def _path(self) -> str:
        return fmt.part_path(self._first + len(self.entries))

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None:
            path = self._tmp / self._path()
            self._writer = pq.ParquetWriter(path, self._target, compression="snappy")
        # One contiguous chunk: page boundaries must not follow the caller's batch boundaries.
        group = pa.Table.from_batches(self._pending, schema=self._target).combine_chunks()
        self._writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
        self._pending, self._pending_rows = [], 0

    def _close_part(self) -> None:
        self._flush()
        if self._writer is None:
            return
        self._writer.close()
        entry = hashed_entry(self._tmp, self._path(), self._rows_in_part, self._hashed)
        self.entries.append(entry)
        self._writer, self._rows_in_part = None, 0


def hashed_entry(tmp: Path, rel: str, rows: int, hashed: dict[str, Fingerprint]) -> FileEntry:
    """Flush a written file, hash it once, and remember its fingerprint for the verification."""
    p = tmp / rel
    fsync_file(p)
    digest = sha256_file(p)
    os.chmod(p, READ_ONLY)
    hashed[rel] = Fingerprint.of(p)
    return FileEntry(path=rel, sha256=digest, bytes=p.stat().st_size, rows=rows)


def write_outstanding(
    tmp: Path, ids: Sequence[str] | pa.Array, id_field: str, hashed: dict[str, Fingerprint]
) -> FileEntry:
    """Write the outstanding ids as ``outstanding.parquet``: one non-null string column."""
    arr = (
        pa.array(ids, type=pa.string()) if not isinstance(ids, pa.Array) else ids.cast(pa.string())
    )
    if arr.null_count:
        raise IdentifierError(f"outstanding ids hold {arr.null_count} null(s)")
    schema = pa.schema([pa.field(id_field, pa.string(), nullable=False)])
    pq.write_table(pa.table([arr], schema=schema), tmp / fmt.OUTSTANDING_NAME, compression="snappy")
    return hashed_entry(tmp, fmt.OUTSTANDING_NAME, len(arr), hashed)
