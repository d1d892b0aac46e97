"""The index of a verified snapshot: ordered parts, their row offsets and every item id.

Built once from the manifest of a :class:`~pipeline.bundle.VerifiedSnapshot` — never by listing
a directory — so a reader can reach exactly the rows the manifest binds. Ids stay an Arrow
string array (about 10 bytes an id plus offsets, so 10M ids fit comfortably), never Python
objects. An index can be saved to a file and loaded back, so a run can pin what it trained on.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import atomic_write_bytes
from pipeline.bundle.contents import count_ids_decoded
from pipeline.bundle.digest import cpu_count, sha256_buffers, sha256_bytes
from pipeline.bundle.errors import BundleError, RowCountMismatch
from pipeline.bundle.manifest import Manifest, Schema
from pipeline.bundle.verify import VerifiedSnapshot, require_verified, verify

INDEX_VERSION = 1
_META_KEY = b"lithi_index"


class IndexMismatch(BundleError):
    """A saved index does not belong to the bundle it is loaded against, or was altered."""


def as_index(obj: object, what: str) -> Index:
    """``obj`` if it is an :class:`Index`, else the index of the verified snapshot it must be.

    Anything but an index or a :class:`~pipeline.bundle.VerifiedSnapshot` raises
    :class:`~pipeline.bundle.errors.NotVerified` naming ``what`` asked for it.
    """
    if isinstance(obj, Index):
        return obj
    return Index.from_snapshot(require_verified(obj, what))


#: offsets rebased and widened this many at a time into one reused buffer: a copy of every
#: offset at once would be a fresh allocation as large as the ids, paid in page faults
_DIGEST_OFFSETS = 1 << 20


def _ids_sha256(ids: pa.Array | pa.ChunkedArray) -> str:
    """Digest of the ids as one sequence, however they are chunked: every offset rebased to
    zero (as little-endian int64), then the value bytes."""
    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    spans = []  # each chunk's offsets, as numpy over its own buffer, and its values
    for chunk in chunks:
        offsets = np.frombuffer(
            chunk.buffers()[1], dtype=np.int32, count=len(chunk) + 1, offset=chunk.offset * 4
        )
        spans.append((offsets, chunk.buffers()[2]))
    block = np.empty(_DIGEST_OFFSETS, dtype="<i8")

    def rebased() -> Iterator[memoryview]:
        base = 0  # bytes of every chunk before this one
        for k, (offsets, _) in enumerate(spans):
            # a chunk's first offset is the previous chunk's last: the sequence names it once
            own = offsets if k == 0 else offsets[1:]
            for a in range(0, len(own), len(block)):
                seg = own[a : a + len(block)]
                out = np.subtract(seg, offsets[0], out=block[: len(seg)])
                yield np.add(out, base, out=out).data
            base += int(offsets[-1] - offsets[0])
        if not spans:
            yield np.zeros(1, dtype="<i8").data

    def values() -> Iterator[memoryview]:
        for offsets, data in spans:
            if data is not None and len(offsets) > 1:
                yield memoryview(data)[offsets[0] : offsets[-1]]

    return sha256_buffers(itertools.chain(rebased(), values()))


def read_columns(paths: Sequence[Path], name: str) -> list[pa.ChunkedArray]:
    """Column ``name`` of every file, in order, the files read side by side (a thread a core):
    one column of one file is too little work for Arrow to spread over the cores itself."""

    def one(path: Path) -> pa.ChunkedArray:
        with pq.ParquetFile(path) as pf:
            return pf.read(columns=[name], use_threads=False).column(0)

    with ThreadPoolExecutor(max_workers=max(1, min(len(paths), cpu_count()))) as pool:
        return list(pool.map(one, paths))


@dataclass(frozen=True, eq=False)
class Index:
    """Every item of one verified snapshot, in index order (parts in manifest order)."""

    snapshot: VerifiedSnapshot
    #: every id in index order, chunked as read (``take``, ``[i]`` and ``len`` as an array)
    ids: pa.ChunkedArray
    part_offsets: np.ndarray
    #: The file it was loaded from (:meth:`load`), so a consumer can load it again instead of
    #: decoding the bundle's ids; ``None`` for an index built from its snapshot.
    saved_at: str | None = field(default=None, compare=False)

    @classmethod
    def from_snapshot(cls, snapshot: VerifiedSnapshot) -> Index:
        """Build the index from a verified snapshot's manifest, reading only the id column."""
        snapshot = require_verified(snapshot, "Index.from_snapshot")
        m = snapshot.manifest
        chunks: list[pa.Array] = []
        paths = snapshot.part_paths()
        columns = read_columns(paths, m.item_id_field)
        for entry, path, col in zip(m.parts, paths, columns, strict=True):
            if len(col) != entry.rows:  # the file changed after verification
                raise RowCountMismatch(
                    f"{path}: manifest says {entry.rows} rows, found {len(col)}; "
                    "re-verify the bundle",
                    path=entry.path,
                )
            chunks.extend(col.cast(pa.string()).chunks)
        # kept as read, a chunk per row group: one array would be a second copy of every id
        ids = pa.chunked_array(chunks, type=pa.string())
        count_ids_decoded(m.snapshot.content_sha256, len(ids))
        return cls(snapshot, ids, _offsets([p.rows for p in m.parts]))

    # -- what the manifest declares -------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        """The manifest the index was built from."""
        return self.snapshot.manifest

    @property
    def schema(self) -> Schema:
        """The declared schema: the only source of column types."""
        return self.manifest.schema_

    @property
    def id_field(self) -> str:
        """The manifest's ``item_id_field``."""
        return self.manifest.item_id_field

    @property
    def part_rows(self) -> list[int]:
        """Rows per part, in manifest order."""
        return [p.rows for p in self.manifest.parts]

    @property
    def part_paths(self) -> list[Path]:
        """Absolute paths of the parts, in manifest order."""
        return self.snapshot.part_paths()

    @property
    def snapshot_tag(self) -> str:
        """``"<version_id>:<content_sha256>"``: what names the data in a reader's split or state."""
        return self.snapshot.identity.tag

    @property
    def is_result(self) -> bool:
        """Whether batches carry the ``lithi_*`` result columns."""
        return self.manifest.kind == "result"

    def __getstate__(self) -> dict[str, Any]:
        # Chunks read from a file are often slices of one larger decoded buffer, and Arrow
        # pickles a slice's whole buffers: a spawned DataLoader worker would receive every
        # buffer once per chunk that shares it. One compact chunk pickles as the ids alone.
        state = dict(self.__dict__)
        state["ids"] = pa.chunked_array([self.ids.combine_chunks()], type=pa.string())
        return state

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        s = self.snapshot.identity
        return f"Index({len(self)} items in {len(self.part_rows)} parts of {s.version_id})"

    # -- positions ------------------------------------------------------------------------
    def locate(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map index positions to ``(part index, row within part)`` arrays."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= len(self)):
            bad = pos[(pos < 0) | (pos >= len(self))][0]
            raise IndexError(f"position {bad} is outside 0..{len(self) - 1}")
        part = np.searchsorted(self.part_offsets, pos, side="right") - 1
        return part, pos - self.part_offsets[part]

    def resolve_columns(self, columns: Iterable[str] | None) -> list[str]:
        """Columns a batch holds, in declared order: the requested ones plus id and lithi_*.

        ``None`` means every declared column. The id field and (for result bundles) the
        ``lithi_*`` columns are always included, so no batch loses identity or status.
        """
        declared = self.schema.names
        if columns is None:
            return list(declared)
        wanted = set(columns)
        unknown = sorted(wanted - set(declared))
        if unknown:
            raise KeyError(f"columns {unknown} are not declared (declared: {declared})")
        wanted.add(self.id_field)
        if self.is_result:
            wanted.update(fmt.RESULT_COLUMNS)
        return [c for c in declared if c in wanted]

    # -- identity -------------------------------------------------------------------------
    def _header(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "index_version": INDEX_VERSION,
            "snapshot": m.snapshot.model_dump(),
            "item_id_field": m.item_id_field,
            "parts": [{"path": p.path, "sha256": p.sha256, "rows": p.rows} for p in m.parts],
            "ids_sha256": self._ids_digest,
        }

    @functools.cached_property
    def _ids_digest(self) -> str:  # the ids never change: hashed once per index, not per use
        return _ids_sha256(self.ids)

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the snapshot identity, the part list and the ids: what to pin in a record."""
        return _header_digest(self._header())

    # -- persistence ----------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index (ids plus a JSON header with its digest) atomically to ``path``."""
        header = self._header()
        header["index_sha256"] = _header_digest(header)
        table = pa.table({"id": self.ids}).replace_schema_metadata(
            {_META_KEY: json.dumps(header, sort_keys=True).encode()}
        )
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        snapshot_root: str | os.PathLike[str] | None = None,
        *,
        snapshot: VerifiedSnapshot | None = None,
    ) -> Index:
        """Load a saved index and bind it to a freshly verified bundle, refusing any mismatch.

        The bundle at ``snapshot_root`` is verified in full (or ``snapshot`` is taken as already
        verified); its identity and part list must equal the saved ones and the saved ids must
        still hash to the saved digest, so a stale or edited index file never loads.
        """
        if snapshot is None:
            if snapshot_root is None:
                raise ValueError("Index.load needs snapshot_root= or snapshot=")
            snapshot = verify(snapshot_root)
        snapshot = require_verified(snapshot, "Index.load")
        table = pq.read_table(path)
        meta = (table.schema.metadata or {}).get(_META_KEY)
        if meta is None:
            raise IndexMismatch(f"{path}: not a saved index (no {_META_KEY.decode()} header)")
        saved = json.loads(meta)
        ids = table.column("id").cast(pa.string())
        offsets = _offsets([p.rows for p in snapshot.manifest.parts])
        index = cls(snapshot, ids, offsets, saved_at=os.fspath(path))
        found = index._header()
        for key in ("index_version", "snapshot", "item_id_field", "parts", "ids_sha256"):
            if saved.get(key) != found[key]:
                raise IndexMismatch(
                    f"{path}: {key} expected {saved.get(key)!r:.200} (saved index), found "
                    f"{found[key]!r:.200} (bundle at {snapshot.root}); rebuild the index",
                    path=str(path),
                )
        if saved.get("index_sha256") != _header_digest(found):
            raise IndexMismatch(f"{path}: index_sha256 does not match its contents")
        return index


def _offsets(rows: Sequence[int]) -> np.ndarray:
    out = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.asarray(rows, dtype=np.int64), out=out[1:])
    return out


def _canon(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _header_digest(header: dict[str, Any]) -> str:
    return sha256_bytes(_canon({k: v for k, v in header.items() if k != "index_sha256"}))
