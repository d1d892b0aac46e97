"""Stage data as an immutable bundle: parts first, manifest last, one atomic rename into place.

A crash at any point leaves either no bundle under the final name or a complete one. Parts and
the manifest are written and fsynced inside a hidden temporary sibling directory, the result is
verified there, and only then is the directory renamed to its final name with
``RENAME_NOREPLACE``, so an existing version is never overwritten or modified. Every file of a
staged bundle is read-only (:data:`~pipeline.bundle.atomic.READ_ONLY`): parts are hard-linked
between versions, so a write in place would change several versions at once. A failure (a
refused table, a full or read-only disk) leaves nothing behind: not the staging directory, not
a parent directory it created.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import (
    READ_ONLY,
    atomic_write_text,
    fsync_dir,
    make_parents,
    remove_created,
    rename_noreplace,
)
from pipeline.bundle.digest import content_sha256
from pipeline.bundle.errors import (
    BundleError,
    BundleExists,
    CountMismatch,
    DuplicateIds,
    IdentifierError,
    SchemaMismatch,
    one_line,
    problem,
)
from pipeline.bundle.fingerprint import Fingerprint, trust_recorded
from pipeline.bundle.leftovers import sweep, work_name
from pipeline.bundle.manifest import (
    Counts,
    FileEntry,
    InputRef,
    JobInfo,
    Kind,
    LineageHints,
    Manifest,
    NextAction,
    Schema,
    SnapshotId,
    bundle_error,
    check_lineage,
    check_result_columns,
)
from pipeline.bundle.verify import VerifiedSnapshot, verify
from pipeline.bundle.writer import (
    ROW_GROUP_ROWS,
    PartWriter,
    ReusedPart,
    link_parts,
    write_outstanding,
)

__all__ = ["DEFAULT_ROWS_PER_PART", "ROW_GROUP_ROWS", "ReusedPart", "new_version_id", "stage"]

DEFAULT_ROWS_PER_PART = 262_144

#: How a caller of :func:`stage` fixes each lineage problem.
_HINTS = LineageHints(
    drop_input="pass input=None",
    name_input="pass input=InputRef(...)",
    describe_job="pass job=JobInfo(...)",
    drop_job="pass job=None",
)


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
    than memory streams through. Column types are declared from ``schema`` (or the table's) in
    the v1 vocabulary and every batch is safely cast to them
    (:func:`~pipeline.bundle.format.conform`). ``reuse_parts`` are bound first, as hard links.
    For a PARTIAL result pass ``outstanding_ids``; ``job.next_action`` is filled in from their
    count. ``source`` names where the rows come from (a file) in errors about them. Everything
    that can be checked before writing is: lineage, version id, schema, the result columns.
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
    check_lineage(kind, has_input=input is not None, has_job=job is not None, hints=_HINTS)
    if isinstance(data, pa.Table):
        schema = schema or data.schema
        batches: Iterable[pa.RecordBatch] = data.to_batches(max_chunksize=ROW_GROUP_ROWS)
    elif schema is None:
        raise ValueError("stage() needs schema= when data is a stream of record batches")
    else:
        batches = data
    declared = _declare(fmt.vocabulary_schema(schema, id_field))
    if kind == "result":
        try:
            check_result_columns(declared)
        except ValueError as e:
            raise SchemaMismatch(f"{source or 'the table'}: {e}") from None
    target = declared.to_arrow()

    created = make_parents(dest.parent)
    sweep(dest.parent, "staging")  # what killed stagings left here
    tmp = work_name(dest, "staging")
    # Files this call wrote and hashed: verified below without hashing them a second time.
    hashed: dict[str, Fingerprint] = {}
    try:
        (tmp / fmt.PARTS_DIR).mkdir(parents=True)
        parts = link_parts(tmp, reuse_parts)
        status_counts = dict.fromkeys(fmt.STATUSES, 0)
        with PartWriter(tmp, target, rows_per_part, len(parts), hashed) as writer:
            for batch in batches:
                batch = _conform(batch, target, id_field)
                if kind == "result":
                    _add_statuses(batch.column(fmt.STATUS_COLUMN), status_counts)
                writer.write(batch, on_rows)
        parts += writer.entries
        for r in reuse_parts:  # reused parts' statuses count too; read just that column
            if kind == "result":
                col = pq.read_table(r.bundle / r.entry.path, columns=[fmt.STATUS_COLUMN])
                _add_statuses(col.column(0), status_counts)
        outstanding = None
        if outstanding_ids is not None and len(outstanding_ids) > 0:
            outstanding = write_outstanding(tmp, outstanding_ids, id_field, hashed)
        fsync_dir(tmp / fmt.PARTS_DIR)
        manifest = _manifest(
            kind=kind,
            declared=declared,
            id_field=id_field,
            parts=parts,
            outstanding=outstanding,
            status_counts=status_counts,
            job=job,
            input=input,
            version_id=version_id,
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
        remove_created(created)
        raise
    # The rename moved exactly the verified files (RENAME_NOREPLACE: nothing was merged into an
    # existing directory), so hashing them again would prove nothing new.
    return VerifiedSnapshot(root=dest.resolve(), manifest=staged.manifest, stats=staged.stats)


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


def _declare(schema: pa.Schema) -> Schema:
    """The manifest's schema for ``schema``; a rule it breaks (a column named like the readers'
    null mask of another) is a one-line :class:`SchemaMismatch`."""
    try:
        return Schema.from_arrow(schema)
    except ValidationError as e:

        def each(err: ErrorDetails) -> str:  # a column's own field, or the schema as a whole
            return (
                f"column {err['input']!r}: {problem(err)}"
                if err["loc"] == ("name",)
                else problem(err)
            )

        raise SchemaMismatch(one_line(e, each=each)) from None


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
    """A batch as declared (:func:`~pipeline.bundle.format.conform`), its columns exactly the
    declared ones and no null where the declaration has none."""
    if batch.schema.names != target.names:
        raise SchemaMismatch(
            f"record batch columns {batch.schema.names} differ from the declared {target.names}"
        )
    for name, col, f in zip(target.names, batch.columns, target, strict=True):
        if not f.nullable and col.null_count:
            cls = IdentifierError if name == id_field else SchemaMismatch
            raise cls(f"column {name!r} is declared non-null but holds {col.null_count} null(s)")
    try:
        return fmt.conform(batch, target)
    except fmt.CastRefused as e:
        raise SchemaMismatch(str(e), path=e.column) from None


def _manifest(
    *,
    kind: Kind,
    declared: Schema,
    id_field: str,
    parts: list[FileEntry],
    outstanding: FileEntry | None,
    status_counts: dict[str, int],
    job: JobInfo | None,
    input: InputRef | None,
    version_id: str | None,
) -> Manifest:
    """The manifest binding what was written: counts from the rows, a PARTIAL job's
    ``next_action`` from the outstanding list, the digest over every bound file."""
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
    except ValidationError as e:
        raise bundle_error(e) from None
