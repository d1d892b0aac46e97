"""The contents stage of verification: what the intact Parquet files hold.

For every bound file whose bytes matched its sha256: the footer's row count against its row
groups, the entry and the id values; null ids; the Parquet schema against the declared one. Then,
across the bundle, ids unique and a result's status counts equal to the manifest's. Only the id
and ``lithi_status`` columns are read. Whatever a file holds, its problems come back as
violations: pyarrow's errors on a hostile file are never raised.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import cpu_count
from pipeline.bundle.errors import (
    BundleError,
    CountMismatch,
    DuplicateIds,
    IdentifierError,
    RowCountMismatch,
    SchemaMismatch,
)
from pipeline.bundle.ids import duplicates, id_hashes
from pipeline.bundle.manifest import FileEntry, Manifest

_decoded: Counter[str] = Counter()
_decoded_lock = threading.Lock()


def ids_decoded(content_sha256: str | None = None) -> int:
    """Item ids this process has decoded from bundles so far: to check them (here) and to index
    them (:meth:`pipeline.readers.Index.from_snapshot`); of the bundle with that
    ``content_sha256``, or of every bundle.

    Read it before and after a piece of work to see what that work decoded again (a load by
    receipt decodes nothing: :mod:`pipeline.bundle.receipt`); it only ever grows.
    """
    with _decoded_lock:
        return _decoded[content_sha256] if content_sha256 else sum(_decoded.values())


def count_ids_decoded(content_sha256: str, n: int) -> None:
    """Add ``n`` ids decoded from the bundle ``content_sha256`` (see :func:`ids_decoded`)."""
    with _decoded_lock:
        _decoded[content_sha256] += n


@dataclass(frozen=True)
class _File:
    """One file to inspect: its entry, the schema it must have, the columns read beside the id."""

    entry: FileEntry
    expected: pa.Schema
    extra: list[str]


@dataclass
class _Found:
    """What one file's checks found; computed in a worker thread, merged in manifest order."""

    errors: list[BundleError] = field(default_factory=list)
    table: pa.Table | None = None  # the id column
    schema_ok: bool = False
    hashes: np.ndarray | None = None  # 64-bit hashes of the ids, for the uniqueness check
    #: a result part's rows per status value, counted in the thread (then the column dropped)
    statuses: tuple[dict[str, int], dict[str | None, int]] | None = None


def check_contents(root: Path, manifest: Manifest, intact: set[str]) -> list[BundleError]:
    """Row counts, schemas, ids and status counts of the files whose bytes are ``intact``.

    Files are read in parallel threads (Parquet decoding and id hashing release the GIL); the
    findings are merged in manifest order, so the error order does not depend on scheduling.
    """
    id_field = manifest.item_id_field
    is_result = manifest.kind == "result"
    declared = manifest.schema_.to_arrow()
    extra = [fmt.STATUS_COLUMN] if is_result else []
    files = [_File(entry, declared, extra) for entry in manifest.parts]
    if manifest.outstanding is not None:
        out_schema = pa.schema([pa.field(id_field, pa.string(), nullable=False)])
        files.append(_File(manifest.outstanding, out_schema, []))
    todo = [f for f in files if f.entry.path in intact]

    def inspect(f: _File) -> _Found:
        return _inspect_file(root / f.entry.path, f, id_field)

    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), cpu_count()))) as pool:
        found = dict(zip([f.entry.path for f in todo], pool.map(inspect, todo), strict=True))
    decoded = sum(r.table.num_rows for r in found.values() if r.table is not None)
    count_ids_decoded(manifest.snapshot.content_sha256, decoded)

    errors: list[BundleError] = []
    id_arrays: list[tuple[str, pa.ChunkedArray]] = []
    hashes: list[np.ndarray] = []
    status_counts = dict.fromkeys(fmt.STATUSES, 0)
    all_counted = all(e.path in found for e in manifest.parts)  # else counts are not comparable
    for f in files:
        entry = f.entry
        result = found.get(entry.path)
        if result is None:
            continue
        errors.extend(result.errors)
        if result.table is not None and result.hashes is not None:
            id_arrays.append((entry.path, result.table.column(id_field)))
            hashes.append(result.hashes)
        if entry is manifest.outstanding:
            continue
        if not result.schema_ok or result.table is None:
            all_counted = False
        elif is_result:
            assert result.statuses is not None  # a readable part with its declared schema
            unknown = _count_statuses(root / entry.path, entry, result.statuses, status_counts)
            errors.extend(unknown)
            all_counted = all_counted and not unknown
    errors.extend(_unique_ids(root, id_field, id_arrays, hashes))
    if is_result and all_counted:
        expected_counts = manifest.counts.by_status
        if status_counts != expected_counts:
            errors.append(
                CountMismatch(
                    f"{root / fmt.MANIFEST_NAME}: counts by status expected "
                    f"{expected_counts} (manifest), found {status_counts} in the parts",
                    path=fmt.MANIFEST_NAME,
                )
            )
    return errors


def _inspect_file(p: Path, f: _File, id_field: str) -> _Found:
    """Footer, row count, null ids and schema of one file; reads only the id/status columns."""
    found = _Found()
    try:
        pf = _open_parquet(p, f.entry, found.errors)
        if pf is None:
            return found
        found.table = _read_ids(p, f.entry, pf, id_field, f.extra, found.errors)
        problem = schema_difference(f.expected, pf.schema_arrow)
        if problem:
            found.errors.append(SchemaMismatch(f"{p}: {problem}", path=f.entry.path))
        found.schema_ok = problem is None
        if found.table is not None:
            found.hashes = id_hashes(found.table.column(id_field))
            if fmt.STATUS_COLUMN in f.extra and fmt.STATUS_COLUMN in found.table.column_names:
                found.statuses = fmt.count_statuses(found.table.column(fmt.STATUS_COLUMN))
            found.table = found.table.select([id_field])  # kept until every id is compared
    except (pa.ArrowException, OSError, ValueError) as e:
        found.errors.append(
            SchemaMismatch(f"{p}: not a readable Parquet file: {e}", path=f.entry.path)
        )
        found.table, found.schema_ok, found.hashes = None, False, None
    return found


def _open_parquet(p: Path, entry: FileEntry, errors: list[BundleError]) -> pq.ParquetFile | None:
    """Open a Parquet file's footer and check its row count against the entry and itself.

    The footer's total is checked against its row groups: a file whose footer says 3 rows while
    its row group holds 4 reads differently depending on which number a reader trusts.
    """
    try:
        pf = pq.ParquetFile(p)
        meta = pf.metadata
        group_rows = sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    except (pa.ArrowException, OSError, ValueError) as e:
        errors.append(SchemaMismatch(f"{p}: not a readable Parquet file: {e}", path=entry.path))
        return None
    if meta.num_rows != group_rows:
        errors.append(
            RowCountMismatch(
                f"{p}: Parquet footer says {meta.num_rows} rows, its row groups hold {group_rows}",
                path=entry.path,
            )
        )
        return None
    if meta.num_rows != entry.rows:
        errors.append(
            RowCountMismatch(
                f"{p}: manifest says {entry.rows} rows, Parquet holds {meta.num_rows}",
                path=entry.path,
            )
        )
    return pf


def _read_ids(
    p: Path,
    entry: FileEntry,
    pf: pq.ParquetFile,
    id_field: str,
    extra: list[str],
    errors: list[BundleError],
) -> pa.Table | None:
    """Read only the id column (and ``extra`` columns) and reject null ids.

    Runs before the schema comparison so that a part whose id column was written nullable and
    holds nulls is reported as what it is, a null id, not only as a nullability difference.
    """
    names = pf.schema_arrow.names
    if id_field not in names:
        return None
    t = pf.schema_arrow.field(id_field).type
    if not (
        pa.types.is_string(t) or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))
    ):
        return None  # the schema check names the wrong type
    try:
        table = pf.read(columns=[id_field, *[c for c in extra if c in names]])
    except (pa.ArrowException, OSError) as e:  # a footer that parses over pages that do not
        errors.append(SchemaMismatch(f"{p}: id column unreadable: {e}", path=entry.path))
        return None
    if table.num_rows != pf.metadata.num_rows:  # pages that hold other than their footer says
        errors.append(
            RowCountMismatch(
                f"{p}: id column {id_field!r} holds {table.num_rows} values, the footer says "
                f"{pf.metadata.num_rows} rows",
                path=entry.path,
            )
        )
        return None
    ids = table.column(id_field)
    if ids.null_count:
        errors.append(
            IdentifierError(
                f"{p}: {ids.null_count} null value(s) in id column {id_field!r}; "
                "expected every item to have an id",
                path=entry.path,
            )
        )
    return table


def _count_statuses(
    p: Path,
    entry: FileEntry,
    statuses: tuple[dict[str, int], dict[str | None, int]],
    counts: dict[str, int],
) -> list[BundleError]:
    """Add a part's status counts to ``counts``; each value that is not a status is a violation."""
    found, unknown = statuses
    for status, n in found.items():
        counts[status] += n
    return [
        CountMismatch(
            f"{p}: {fmt.STATUS_COLUMN} holds {value!r} ({n} rows); expected one of {fmt.STATUSES}",
            path=entry.path,
        )
        for value, n in unknown.items()
    ]


def _unique_ids(
    root: Path,
    id_field: str,
    id_arrays: list[tuple[str, pa.ChunkedArray]],
    hashes: list[np.ndarray],
) -> list[BundleError]:
    """Ids must be unique across all parts and the outstanding list (nulls reported already)."""
    n_dups, examples = duplicates([col for _, col in id_arrays], hashes=hashes)
    if not n_dups:
        return []
    first = examples[0]
    where = [p for p, col in id_arrays if pc.any(pc.equal(col.cast(pa.string()), first)).as_py()]
    return [
        DuplicateIds(
            f"{root}: {n_dups} id(s) in {id_field!r} appear more than once "
            f"(expected each exactly once), e.g. {first!r} in {', '.join(where)}",
            path=where[0] if where else None,
            count=n_dups,
            examples=examples,
        )
    ]


def schema_difference(declared: pa.Schema, found: pa.Schema) -> str | None:
    """Describe how ``found`` differs from ``declared`` (names, order, types, nullability)."""
    if found.names != declared.names:
        return f"columns expected {declared.names}, found {found.names}"
    for d, f in zip(declared, found, strict=True):
        try:
            found_type = fmt.from_arrow(f.type)
        except fmt.UnknownType:
            found_type = str(f.type)
        expected_type = fmt.from_arrow(d.type)
        if found_type != expected_type:
            return f"column {d.name!r}: type expected {expected_type}, found {found_type}"
        if f.nullable != d.nullable:
            return f"column {d.name!r}: nullable expected {d.nullable}, found {f.nullable}"
    return None
