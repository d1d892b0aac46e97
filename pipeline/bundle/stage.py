"""Stage data as an immutable bundle: parts first, manifest last, one atomic rename into place.

A crash at any point leaves either no bundle under the final name or a complete one. Parts and
the manifest are written and fsynced inside a hidden temporary sibling directory, the result is
verified there, and only then is the directory renamed to its final name with
``RENAME_NOREPLACE``, so an existing version is never overwritten or modified. Every file of a
staged bundle is read-only (0444): parts are hard-linked between versions, so a write in place
would change several versions at once. A failure (a refused table, a full or read-only disk)
leaves nothing behind: not the staging directory, not a parent directory it created.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import atomic_write_text, fsync_dir, fsync_file, rename_noreplace
from pipeline.bundle.digest import content_sha256, sha256_file
from pipeline.bundle.errors import (
    BundleError,
    BundleExists,
    CountMismatch,
    DuplicateIds,
    IdentifierError,
    SchemaMismatch,
)
from pipeline.bundle.fingerprint import Fingerprint, trust_recorded
from pipeline.bundle.manifest import (
    Counts,
    FileEntry,
    InputRef,
    JobInfo,
    Kind,
    Manifest,
    NextAction,
    Schema,
    SnapshotId,
    bundle_error,
)
from pipeline.bundle.verify import VerifiedSnapshot, verify

DEFAULT_ROWS_PER_PART = 262_144
ROW_GROUP_ROWS = 65_536  # the iterable reader's memory bound is one row group of one part
#: Mode of every staged file: read-only for everyone (hard links share it between versions).
READ_ONLY = 0o444


@dataclass(frozen=True)
class ReusedPart:
    """A part of an earlier bundle to bind again: hard-linked into the new one, never rewritten."""

    bundle: Path
    entry: FileEntry


def new_version_id(kind: str) -> str:
    """A version id unique per staging: kind, UTC time to the microsecond, and 32 random bits."""
    return f"{kind}-{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{secrets.token_hex(4)}"


def stage(
    data: pa.Table | Iterable[pa.RecordBatch],
    dest: str | os.PathLike[str],
    *,
    id_field: str,
    kind: Kind,
    schema: pa.Schema | None = None,
    rows_per_part: int = DEFAULT_ROWS_PER_PART,
    job: JobInfo | None = None,
    input: InputRef | None = None,
    outstanding_ids: Sequence[str] | pa.Array | None = None,
    reuse_parts: Sequence[ReusedPart] = (),
    version_id: str | None = None,
    on_rows: Callable[[int], None] | None = None,
    source: str | None = None,
) -> VerifiedSnapshot:
    """Write ``data`` as a bundle at ``dest`` (which must not exist) and return it verified.

    ``data`` is a table, or an iterable of record batches with ``schema`` given, so data larger
    than memory streams through. Column types are declared from ``schema`` (or the table's) and
    every batch is cast to them: dictionary, large and view types become their plain type, any
    timestamp with a zone becomes ``timestamp[us,UTC]`` (refused if that would lose precision);
    another type is refused naming its column. ``reuse_parts`` are bound first, as hard links.
    For a PARTIAL result pass ``outstanding_ids``; ``job.next_action`` is filled in from their
    count. ``source`` names where the rows come from (a file) in errors about them.
    Everything that can be checked before writing is: lineage, version id, schema, the result
    columns.
    """
    dest = Path(dest)
    if os.path.lexists(dest):
        raise BundleExists(
            f"{dest}: a bundle already exists there and is never overwritten", path=str(dest)
        )
    if rows_per_part < 1:
        raise ValueError(f"rows_per_part must be >= 1, got {rows_per_part}")
    if version_id is not None:
        fmt.check_version_id(version_id)
    _check_lineage(kind, job, input)
    if isinstance(data, pa.Table):
        schema = schema or data.schema
        batches: Iterable[pa.RecordBatch] = data.to_batches(max_chunksize=ROW_GROUP_ROWS)
    elif schema is None:
        raise ValueError("stage() needs schema= when data is a stream of record batches")
    else:
        batches = data
    declared = _declare(_plain(schema, id_field))
    if kind == "result":
        _check_result_columns(declared, source)
    target = declared.to_arrow()

    created = _make_parents(dest.parent)
    tmp = dest.parent / f".{dest.name}.staging-{secrets.token_hex(6)}"
    # Files this call wrote and hashed: verified below without hashing them a second time.
    hashed: dict[str, Fingerprint] = {}
    try:
        (tmp / fmt.PARTS_DIR).mkdir(parents=True)
        parts = _link_parts(tmp, reuse_parts)
        status_counts = dict.fromkeys(fmt.STATUSES, 0)
        parts += _write_parts(
            tmp,
            batches,
            target,
            id_field,
            kind,
            rows_per_part,
            len(parts),
            status_counts,
            on_rows,
            hashed,
        )
        for r in reuse_parts:  # reused parts' statuses count too; read just that column
            if kind == "result":
                col = pq.read_table(r.bundle / r.entry.path, columns=[fmt.STATUS_COLUMN])
                _add_statuses(col.column(0), status_counts)
        outstanding = None
        if outstanding_ids is not None and len(outstanding_ids) > 0:
            outstanding = _write_outstanding(tmp, outstanding_ids, id_field, hashed)
        fsync_dir(tmp / fmt.PARTS_DIR)
        manifest = _manifest(
            kind, declared, id_field, parts, outstanding, status_counts, job, input, version_id
        )
        atomic_write_text(tmp / fmt.MANIFEST_NAME, manifest.to_json(), replace=False)
        os.chmod(tmp / fmt.MANIFEST_NAME, READ_ONLY)
        # Never publish what would not verify: every rule is checked; only the digests this call
        # just computed from the written files are not computed again. Reused parts are hashed.
        try:
            staged = verify(tmp, trusted=trust_recorded(hashed))
        except BundleError as e:
            raise _about_source(e, tmp, source or str(dest), id_field) from None
        try:
            rename_noreplace(tmp, dest)
        except FileExistsError:
            raise BundleExists(
                f"{dest}: a bundle appeared there while staging; it is left untouched",
                path=str(dest),
            ) from None
        fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_dirs(created)
        raise
    # The rename moved exactly the verified files (RENAME_NOREPLACE: nothing was merged into an
    # existing directory), so hashing them again would prove nothing new.
    return VerifiedSnapshot(root=dest.resolve(), manifest=staged.manifest, stats=staged.stats)


def _check_lineage(kind: str, job: JobInfo | None, input: InputRef | None) -> None:
    """Refuse before writing anything what the manifest would refuse after writing everything."""
    if kind not in ("input", "result", "prediction"):
        raise ValueError(f"kind must be input, result or prediction, got {kind!r}")
    if kind == "input" and input is not None:
        raise ValueError("an input bundle derives from nothing: pass input=None")
    if kind != "input" and input is None:
        raise ValueError(f"a {kind} bundle must name its input snapshot: pass input=InputRef(...)")
    if kind == "result" and job is None:
        raise ValueError("a result bundle must describe its job: pass job=JobInfo(...)")
    if kind != "result" and job is not None:
        raise ValueError(f"job is only for result bundles, not {kind}")


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` and its missing ancestors; return those this call created, deepest last,
    so a failed staging can remove them again."""
    missing: list[Path] = []
    d = parent
    while not os.path.lexists(d):
        missing.append(d)
        d = d.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:  # another process made it: not ours to remove
            continue
        except BaseException:
            _remove_dirs(created)
            raise
        created.append(d)
    return created


def _remove_dirs(created: list[Path]) -> None:
    """Remove directories :func:`_make_parents` created, deepest first, if they are empty."""
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            return  # not empty (someone else's files arrived) or already gone: leave the rest


def _about_source(e: BundleError, tmp: Path, source: str, id_field: str) -> BundleError:
    """The same violation, told about the rows being staged rather than the hidden staging
    directory (which is gone by the time anyone reads the message)."""
    if isinstance(e, DuplicateIds):
        return DuplicateIds(
            f"{source}: {e.count} id(s) in {id_field!r} appear more than once (expected each "
            f"exactly once), e.g. {e.examples[0]!r}",
            path=source,
            count=e.count,
            examples=e.examples,
        )
    message = str(e).replace(f"{tmp}/", "").replace(str(tmp), "the staged bundle")
    return type(e)(f"{source}: {message}", path=e.path)


def _vocabulary_type(name: str, dtype: pa.DataType) -> pa.DataType:
    """The v1 type a source column is declared as, or :class:`~pipeline.bundle.format.UnknownType`
    naming the column and why."""
    if pa.types.is_dictionary(dtype):
        return _vocabulary_type(name, dtype.value_type)
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return pa.binary()
    if pa.types.is_timestamp(dtype):
        if dtype.tz is None:
            raise fmt.UnknownType(
                f"column {name!r}: {dtype} has no time zone; v1 stores instants as "
                "timestamp[us,UTC], so say which zone the values are in before staging"
            )
        return pa.timestamp("us", tz="UTC")  # an instant: only the unit may change (checked)
    if (
        pa.types.is_large_list(dtype)
        or pa.types.is_list_view(dtype)
        or pa.types.is_large_list_view(dtype)
    ):
        return pa.list_(_vocabulary_type(name, dtype.value_type))
    if pa.types.is_list(dtype):
        return pa.list_(_vocabulary_type(name, dtype.value_type))
    if pa.types.is_fixed_size_list(dtype):
        return pa.list_(_vocabulary_type(name, dtype.value_type), dtype.list_size)
    try:
        fmt.from_arrow(dtype)
    except fmt.UnknownType:
        raise fmt.UnknownType(
            f"column {name!r}: type {dtype} is not in the v1 vocabulary "
            f"({', '.join(fmt.SCALAR_TYPES)}, list<T>, fixed_size_list<T,N>)"
        ) from None
    return dtype


def _plain(schema: pa.Schema, id_field: str) -> pa.Schema:
    """Declared types: each source type as its v1 type (see :func:`_vocabulary_type`); the id
    column is non-null."""
    if id_field not in schema.names:
        raise SchemaMismatch(f"id field {id_field!r} is not a column (columns: {schema.names})")
    fields = []
    for f in schema:
        t = _vocabulary_type(f.name, f.type)
        if (pa.types.is_list(t) or pa.types.is_fixed_size_list(t)) and not _scalar(t.value_type):
            raise fmt.UnknownType(
                f"column {f.name!r}: {f.type} is a list of lists; v1 lists hold scalars only"
            )
        nullable = False if f.name == id_field else f.nullable
        fields.append(pa.field(f.name, t, nullable=nullable))
    if not pa.types.is_string(fields[schema.get_field_index(id_field)].type):
        raise IdentifierError(
            f"id field {id_field!r} must be a string column, found "
            f"{schema.field(id_field).type}; ids are never numbers"
        )
    return pa.schema(fields)


def _scalar(dtype: pa.DataType) -> bool:
    try:
        return fmt.from_arrow(dtype) in fmt.SCALAR_TYPES
    except fmt.UnknownType:
        return False


def _declare(schema: pa.Schema) -> Schema:
    """The manifest's schema for ``schema``; a rule it breaks (a column named like the readers'
    null mask of another) is a one-line :class:`SchemaMismatch`."""
    try:
        return Schema.from_arrow(schema)
    except ValidationError as e:
        problems = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise SchemaMismatch(problems) from None


def _check_result_columns(declared: Schema, source: str | None) -> None:
    """A result table needs the ``lithi_*`` columns with their types: say which, before writing."""
    where = source or "the table"
    missing = [c for c in fmt.RESULT_COLUMNS if c not in declared.names]
    if missing:
        raise SchemaMismatch(
            f"{where}: a result bundle needs the columns {', '.join(fmt.RESULT_COLUMNS)}; "
            f"missing {', '.join(missing)} (columns: {', '.join(declared.names)})"
        )
    for name, allowed in fmt.RESULT_COLUMN_TYPES.items():
        found = declared.field(name).type
        if found not in allowed:
            raise SchemaMismatch(
                f"{where}: result column {name!r} must be {' or '.join(allowed)}, found {found}"
            )


def _link_parts(tmp: Path, reuse: Sequence[ReusedPart]) -> list[FileEntry]:
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


def _write_parts(
    tmp: Path,
    batches: Iterable[pa.RecordBatch],
    target: pa.Schema,
    id_field: str,
    kind: str,
    rows_per_part: int,
    first: int,
    status_counts: dict[str, int],
    on_rows: Callable[[int], None] | None,
    hashed: dict[str, Fingerprint],
) -> list[FileEntry]:
    """Write the batches as parts of ``rows_per_part`` rows, in row groups of ``ROW_GROUP_ROWS``.

    Rows are regrouped before writing, so the bytes (and so ``content_sha256``) depend only on
    the content and ``rows_per_part``, never on how the caller happened to batch the stream.
    At most one row group is buffered.
    """
    entries: list[FileEntry] = []
    writer: pq.ParquetWriter | None = None
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    rows_in_part = 0

    def flush() -> None:
        nonlocal writer, pending, pending_rows
        if not pending:
            return
        if writer is None:
            path = tmp / fmt.part_path(first + len(entries))
            writer = pq.ParquetWriter(path, target, compression="snappy")
        # One contiguous chunk: page boundaries must not follow the caller's batch boundaries.
        group = pa.Table.from_batches(pending, schema=target).combine_chunks()
        writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
        pending, pending_rows = [], 0

    def close() -> None:
        nonlocal writer, rows_in_part
        flush()
        if writer is None:
            return
        writer.close()
        rel = fmt.part_path(first + len(entries))
        entries.append(_hashed_entry(tmp, rel, rows_in_part, hashed))
        writer, rows_in_part = None, 0

    try:
        for batch in batches:
            batch = _conform(batch, target, id_field)
            if kind == "result":
                _add_statuses(batch.column(fmt.STATUS_COLUMN), status_counts)
            offset = 0
            while offset < batch.num_rows:
                take = min(
                    rows_per_part - rows_in_part,
                    ROW_GROUP_ROWS - pending_rows,
                    batch.num_rows - offset,
                )
                pending.append(batch.slice(offset, take))
                pending_rows += take
                rows_in_part += take
                offset += take
                if on_rows is not None:
                    on_rows(take)
                if rows_in_part == rows_per_part:
                    close()
                elif pending_rows == ROW_GROUP_ROWS:
                    flush()
        close()
    except BaseException:
        if writer is not None:  # release the file; the staging directory is removed anyway
            with contextlib.suppress(Exception):
                writer.close()
        raise
    return entries


def _add_statuses(col: pa.Array | pa.ChunkedArray, counts: dict[str, int]) -> None:
    """Count ``lithi_status`` values, refusing anything but accepted/failed/abstained."""
    found, unknown = fmt.count_statuses(col)
    for value, n in unknown.items():
        raise CountMismatch(
            f"{fmt.STATUS_COLUMN} holds {value!r} in {n} row(s); "
            f"expected one of {', '.join(fmt.STATUSES)}",
            path=fmt.STATUS_COLUMN,
        )
    for status, n in found.items():
        counts[status] += n


def _conform(batch: pa.RecordBatch, target: pa.Schema, id_field: str) -> pa.RecordBatch:
    if batch.schema.names != target.names:
        raise SchemaMismatch(
            f"record batch columns {batch.schema.names} differ from the declared {target.names}"
        )
    cols = []
    for name, col, f in zip(target.names, batch.columns, target, strict=True):
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if not f.nullable and col.null_count:
            cls = IdentifierError if name == id_field else SchemaMismatch
            raise cls(f"column {name!r} is declared non-null but holds {col.null_count} null(s)")
        if col.type != f.type:
            try:
                col = col.cast(f.type)  # safe: a value that does not fit is refused, not changed
            except (pa.ArrowException, ValueError) as e:
                raise SchemaMismatch(
                    f"column {name!r}: cannot store {col.type} values as "
                    f"{fmt.from_arrow(f.type)}: {' '.join(str(e).split())}",
                    path=name,
                ) from None
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=target)


def _hashed_entry(tmp: Path, rel: str, rows: int, hashed: dict[str, Fingerprint]) -> FileEntry:
    """Flush a written file, hash it once, and remember its fingerprint for the verification."""
    p = tmp / rel
    fsync_file(p)
    digest = sha256_file(p)
    os.chmod(p, READ_ONLY)
    hashed[rel] = Fingerprint.of(p)
    return FileEntry(path=rel, sha256=digest, bytes=p.stat().st_size, rows=rows)


def _write_outstanding(
    tmp: Path, ids: Sequence[str] | pa.Array, id_field: str, hashed: dict[str, Fingerprint]
) -> FileEntry:
    arr = (
        pa.array(ids, type=pa.string()) if not isinstance(ids, pa.Array) else ids.cast(pa.string())
    )
    if arr.null_count:
        raise IdentifierError(f"outstanding ids hold {arr.null_count} null(s)")
    schema = pa.schema([pa.field(id_field, pa.string(), nullable=False)])
    pq.write_table(pa.table([arr], schema=schema), tmp / fmt.OUTSTANDING_NAME, compression="snappy")
    return _hashed_entry(tmp, fmt.OUTSTANDING_NAME, len(arr), hashed)


def _manifest(
    kind, declared, id_field, parts, outstanding, status_counts, job, input, version_id
) -> Manifest:
    bound = [*parts, *([outstanding] if outstanding else [])]
    items = sum(p.rows for p in parts)
    if kind == "result":
        n_out = outstanding.rows if outstanding else 0
        counts = Counts(
            items=items, outstanding=n_out, **{s: status_counts.get(s, 0) for s in fmt.STATUSES}
        )
        if job is not None and job.status == "PARTIAL" and job.next_action is None and n_out:
            job = job.model_copy(
                update={"next_action": NextAction(action="resubmit_outstanding", items=n_out)}
            )
    else:
        counts = Counts(items=items)
    try:
        return _build_manifest(
            kind, declared, id_field, parts, outstanding, counts, bound, job, input, version_id
        )
    except ValidationError as e:
        raise bundle_error(e) from None


def _build_manifest(
    kind, declared, id_field, parts, outstanding, counts, bound, job, input, version_id
) -> Manifest:
    return Manifest(
        manifest_version=fmt.MANIFEST_VERSION,
        kind=kind,
        snapshot=SnapshotId(
            version_id=version_id or new_version_id(kind),
            content_sha256=content_sha256((f.sha256, f.path) for f in bound),
        ),
        job=job,
        input=input,
        item_id_field=id_field,
        schema=declared,
        parts=parts,
        outstanding=outstanding,
        counts=counts,
        created_at=datetime.now(UTC),
    )
