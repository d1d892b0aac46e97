"""Verify a bundle against its manifest and return a frozen, verified snapshot.

Nothing reads a bundle before this has passed. It checks, in order: the manifest exists and
validates; the directory holds exactly the bound files (no extras, no symlinks, nothing outside);
every file's size, sha256 and row count; every part's Parquet schema against the declared one;
ids non-null and unique across parts and the outstanding list; status counts; ``content_sha256``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import format as fmt
from pipeline.digest import content_sha256, sha256_files
from pipeline.errors import (
    BundleError,
    CountMismatch,
    DigestMismatch,
    IdentifierError,
    IncompleteBundle,
    MissingFile,
    RowCountMismatch,
    SchemaMismatch,
    SizeMismatch,
    UnboundFile,
    UnsafePath,
)
from pipeline.manifest import FileEntry, Manifest, SnapshotId, parse_manifest

#: ``trusted(path, entry) -> bool``: may vouch that ``path`` already holds ``entry``'s exact bytes
#: (e.g. a read-only, content-addressed cache object verified before), so it is not hashed again.
TrustFn = Callable[[Path, FileEntry], bool]
#: ``progress(bytes_done, bytes_total)``, called from hashing threads.
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class VerifyStats:
    """What a verification actually read: the cost of a rebuild is measured here."""

    files_total: int
    bytes_total: int
    files_hashed: int
    bytes_hashed: int


@dataclass(frozen=True)
class VerifiedSnapshot:
    """A bundle that passed :func:`verify`: its root, its manifest, and what checking it cost.

    Only this type is accepted by the index and the datasets, so no reader can be pointed at an
    unverified directory by accident.
    """

    root: Path
    manifest: Manifest
    stats: VerifyStats = field(compare=False)

    @property
    def identity(self) -> SnapshotId:
        """The ``snapshot`` identity to pin in an experiment record."""
        return self.manifest.snapshot

    def part_paths(self) -> list[Path]:
        """Absolute paths of the bound parts, in read order."""
        return [self.root / p.path for p in self.manifest.parts]


def verify(
    path: str | os.PathLike[str],
    *,
    trusted: TrustFn | None = None,
    progress: ProgressFn | None = None,
) -> VerifiedSnapshot:
    """Verify the bundle at ``path``; raise the first :class:`BundleError` found, else return it."""
    manifest, errors, stats = check(path, trusted=trusted, progress=progress)
    if errors:
        raise errors[0]
    assert manifest is not None and stats is not None
    return VerifiedSnapshot(root=Path(path).resolve(), manifest=manifest, stats=stats)


def check(
    path: str | os.PathLike[str],
    *,
    trusted: TrustFn | None = None,
    progress: ProgressFn | None = None,
) -> tuple[Manifest | None, list[BundleError], VerifyStats | None]:
    """Find every violation in the bundle at ``path`` (for reports that list them all)."""
    root = Path(path)
    try:
        manifest = read_manifest(root)
    except BundleError as e:
        return None, [e], None
    errors: list[BundleError] = []
    errors += _unbound_files(root, manifest)
    present = _stat_bound(root, manifest, errors)
    stats = _hash_bound(root, manifest, present, errors, trusted, progress)
    if not errors:  # Parquet checks read only files whose bytes are exactly the bound ones
        _check_parquet(root, manifest, errors)
    digest = content_sha256((f.sha256, f.path) for f in manifest.bound_files)
    if digest != manifest.snapshot.content_sha256:
        errors.append(
            DigestMismatch(
                f"{root / fmt.MANIFEST_NAME}: content_sha256 expected "
                f"{manifest.snapshot.content_sha256}"
                f" (manifest), recomputed {digest} from the bound files' sha256 lines",
                path=fmt.MANIFEST_NAME,
            )
        )
    return manifest, errors, stats


def read_manifest(root: Path) -> Manifest:
    """Read and validate ``result-manifest.json``; no manifest means the bundle is incomplete."""
    if not root.is_dir():
        raise IncompleteBundle(f"{root}: not a bundle directory", path=str(root))
    mpath = root / fmt.MANIFEST_NAME
    try:
        st = mpath.lstat()
    except FileNotFoundError:
        raise IncompleteBundle(
            f"bundle incomplete: {root} has no {fmt.MANIFEST_NAME}; part files alone never mean "
            "the job finished",
            path=str(root),
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(
            f"{mpath}: the manifest must be a regular file, not a link or other",
            path=fmt.MANIFEST_NAME,
        )
    return parse_manifest(mpath.read_bytes(), path=str(mpath))


def _unbound_files(root: Path, manifest: Manifest) -> list[BundleError]:
    bound = {f.path for f in manifest.bound_files} | {fmt.MANIFEST_NAME}
    errors: list[BundleError] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        for name in sorted(dirnames):
            rel = (rel_dir / name).as_posix()
            if (Path(dirpath) / name).is_symlink():
                errors.append(
                    UnsafePath(
                        f"{root / rel}: a symlinked directory is not allowed in a bundle", path=rel
                    )
                )
            elif rel != fmt.PARTS_DIR:
                errors.append(
                    UnboundFile(
                        f"{root / rel}: directory not bound by the manifest "
                        f"(only {fmt.PARTS_DIR}/ may exist)",
                        path=rel,
                    )
                )
        for name in sorted(filenames):
            rel = (rel_dir / name).as_posix()
            if rel not in bound:
                errors.append(
                    UnboundFile(
                        f"{root / rel}: file not bound by the manifest; a reader "
                        "could reach it, so epochs would not be reproducible",
                        path=rel,
                    )
                )
    return errors


def _stat_bound(root: Path, manifest: Manifest, errors: list[BundleError]) -> list[FileEntry]:
    present = []
    for entry in manifest.bound_files:
        p = root / entry.path
        try:
            st = p.lstat()
        except FileNotFoundError:
            errors.append(MissingFile(f"{p}: bound by the manifest but missing", path=entry.path))
            continue
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            errors.append(
                UnsafePath(
                    f"{p}: is {kind}; bound files must be regular files inside the bundle",
                    path=entry.path,
                )
            )
            continue
        if st.st_size != entry.bytes:
            errors.append(
                SizeMismatch(
                    f"{p}: expected {entry.bytes} bytes, found {st.st_size}", path=entry.path
                )
            )
            continue
        present.append(entry)
    return present


def _hash_bound(
    root: Path,
    manifest: Manifest,
    present: list[FileEntry],
    errors: list[BundleError],
    trusted: TrustFn | None,
    progress: ProgressFn | None,
) -> VerifyStats:
    todo = [e for e in present if not (trusted and trusted(root / e.path, e))]
    total = sum(e.bytes for e in todo)
    done = 0

    def on_bytes(n: int) -> None:  # list.append-free counter; += on an int is fine under the GIL
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    digests = sha256_files([root / e.path for e in todo], on_bytes=on_bytes)
    for entry, digest in zip(todo, digests, strict=True):
        if digest != entry.sha256:
            errors.append(
                DigestMismatch(
                    f"{root / entry.path}: sha256 expected {entry.sha256}, found {digest}",
                    path=entry.path,
                )
            )
    files = manifest.bound_files
    return VerifyStats(
        files_total=len(files),
        bytes_total=sum(f.bytes for f in files),
        files_hashed=len(todo),
        bytes_hashed=total,
    )


def _check_parquet(root: Path, manifest: Manifest, errors: list[BundleError]) -> None:
    declared = manifest.schema_
    id_field = manifest.item_id_field
    id_arrays: list[tuple[str, pa.ChunkedArray]] = []
    status_counts = dict.fromkeys(fmt.STATUSES, 0)
    for entry in manifest.parts:
        p = root / entry.path
        try:
            pf = pq.ParquetFile(p)
        except (pa.ArrowException, OSError) as e:
            errors.append(SchemaMismatch(f"{p}: not a readable Parquet file: {e}", path=entry.path))
            continue
        if pf.metadata.num_rows != entry.rows:
            errors.append(
                RowCountMismatch(
                    f"{p}: manifest says {entry.rows} rows, Parquet holds {pf.metadata.num_rows}",
                    path=entry.path,
                )
            )
        problem = schema_difference(declared.to_arrow(), pf.schema_arrow)
        if problem:
            errors.append(SchemaMismatch(f"{p}: {problem}", path=entry.path))
            continue
        cols = [id_field] + ([fmt.STATUS_COLUMN] if manifest.kind == "result" else [])
        table = pf.read(columns=cols)
        id_arrays.append((entry.path, table.column(id_field)))
        if manifest.kind == "result":
            _count_statuses(p, entry, table.column(fmt.STATUS_COLUMN), status_counts, errors)
    if manifest.outstanding is not None:
        _check_outstanding(root, manifest, id_arrays, errors)
    _check_ids(root, id_field, id_arrays, errors)
    if manifest.kind == "result" and not errors:
        found = status_counts
        expected = manifest.counts.by_status
        if found != expected:
            errors.append(
                CountMismatch(
                    f"{root / fmt.MANIFEST_NAME}: counts by status expected "
                    f"{expected} (manifest), found {found} in the parts",
                    path=fmt.MANIFEST_NAME,
                )
            )


def _count_statuses(
    p: Path,
    entry: FileEntry,
    col: pa.ChunkedArray,
    counts: dict[str, int],
    errors: list[BundleError],
) -> None:
    for row in pc.value_counts(col).to_pylist():
        value, n = row["values"], row["counts"]
        if value not in counts:
            errors.append(
                CountMismatch(
                    f"{p}: {fmt.STATUS_COLUMN} holds {value!r} ({n} rows); "
                    f"expected one of {fmt.STATUSES}",
                    path=entry.path,
                )
            )
        else:
            counts[value] += n


def _check_outstanding(root: Path, manifest: Manifest, id_arrays: list, errors: list) -> None:
    entry = manifest.outstanding
    assert entry is not None
    p = root / entry.path
    expected = pa.schema([pa.field(manifest.item_id_field, pa.string(), nullable=False)])
    try:
        pf = pq.ParquetFile(p)
    except (pa.ArrowException, OSError) as e:
        errors.append(SchemaMismatch(f"{p}: not a readable Parquet file: {e}", path=entry.path))
        return
    if pf.metadata.num_rows != entry.rows:
        errors.append(
            RowCountMismatch(
                f"{p}: manifest says {entry.rows} rows, Parquet holds {pf.metadata.num_rows}",
                path=entry.path,
            )
        )
    problem = schema_difference(expected, pf.schema_arrow)
    if problem:
        errors.append(SchemaMismatch(f"{p}: {problem}", path=entry.path))
        return
    id_arrays.append((entry.path, pf.read().column(manifest.item_id_field)))


def _check_ids(
    root: Path,
    id_field: str,
    id_arrays: list[tuple[str, pa.ChunkedArray]],
    errors: list[BundleError],
) -> None:
    for path, ids in id_arrays:
        if ids.null_count:
            errors.append(
                IdentifierError(
                    f"{root / path}: {ids.null_count} null value(s) in id column {id_field!r}",
                    path=path,
                )
            )
            return
    if not id_arrays:
        return
    all_ids = pa.chunked_array(
        [c for _, col in id_arrays for c in col.cast(pa.string()).chunks], type=pa.string()
    )
    counts = pc.value_counts(all_ids)
    dup_mask = pc.greater(counts.field("counts"), 1)
    if pc.any(dup_mask).as_py():
        dups = pc.filter(counts.field("values"), dup_mask).to_pylist()
        where = [p for p, col in id_arrays if pc.any(pc.is_in(col, pa.array(dups[:1]))).as_py()]
        errors.append(
            IdentifierError(
                f"{root}: {len(dups)} id(s) in {id_field!r} appear more than once, "
                f"e.g. {dups[0]!r} "
                f"in {', '.join(where)}",
                path=where[0] if where else None,
            )
        )


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
