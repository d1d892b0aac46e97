"""The one part file an iterable stream is reading: opened when first needed, and checked."""

from __future__ import annotations

import pyarrow.parquet as pq

from pipeline.bundle.errors import RowCountMismatch
from pipeline.readers.index import Index


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
