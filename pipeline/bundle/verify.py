"""Verify a bundle against its manifest and return a frozen, verified snapshot.

Nothing reads a bundle before this has passed. It checks, in order: the manifest exists and
validates; the directory holds exactly the bound files (no extras, no symlinks, nothing outside);
every file's size, sha256 and row count; every part's Parquet schema against the declared one;
ids non-null and unique across parts and the outstanding list; status counts; ``content_sha256``.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import content_sha256, cpu_count, sha256_files
from pipeline.bundle.errors import (
    BundleError,
    CountMismatch,
    DigestMismatch,
    DuplicateIds,
    IdentifierError,
    IncompleteBundle,
    ManifestInvalid,
    MissingFile,
    NotVerified,
    RowCountMismatch,
    SchemaMismatch,
    SizeMismatch,
    UnboundFile,
    UnreadableFile,
    UnsafePath,
)
from pipeline.bundle.ids import duplicates, id_hashes
from pipeline.bundle.manifest import FileEntry, Manifest, SnapshotId, parse_manifest

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


def require_verified(obj: object, what: str = "a reader") -> VerifiedSnapshot:
    """Return ``obj`` if it is a :class:`VerifiedSnapshot`, else raise :class:`NotVerified`."""
    if isinstance(obj, VerifiedSnapshot):
        return obj
    hint = " (a Manifest alone proves nothing about the files)" if isinstance(obj, Manifest) else ""
    raise NotVerified(
        f"{what} needs a VerifiedSnapshot returned by pipeline.bundle.verify(path); "
        f"found {type(obj).__name__} {obj!r:.80}{hint}. Call verify(path) first, so no "
        "unverified or unfinished bundle is ever read",
        path=str(obj) if isinstance(obj, (str, os.PathLike)) else None,
    )


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
    """Find every violation in the bundle at ``path`` (for reports that list them all).

    Returns the manifest (``None`` if it is missing or invalid, in which case that is the only
    error), every violation in check order, and what hashing cost. Parquet contents are only
    read from files whose size and sha256 match their entry, so a corrupt file yields one
    digest error rather than a cascade of misleading schema errors.
    """
    root = Path(path)
    try:
        manifest = read_manifest(root)
    except BundleError as e:
        return None, [e], None
    errors: list[BundleError] = []
    errors += _unbound_files(root, manifest)
    present = _stat_bound(root, manifest, errors)
    stats, intact = _hash_bound(root, manifest, present, errors, trusted, progress)
    _check_parquet(root, manifest, intact, errors)
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
    """Read and validate ``result-manifest.json``; no manifest means the bundle is incomplete.

    The manifest is opened without following a symlink and without blocking on a FIFO, must be a
    regular file, and is read only up to ``MAX_MANIFEST_BYTES`` (see :func:`parse_manifest`).
    """
    root = Path(root)
    try:
        is_dir = stat.S_ISDIR(os.stat(root).st_mode)
    except (OSError, ValueError):  # missing, not a directory, a name too long, a NUL byte
        is_dir = False
    if not is_dir:
        raise IncompleteBundle(f"{root}: not a bundle directory", path=str(root))
    mpath = root / fmt.MANIFEST_NAME
    try:
        fd = os.open(mpath, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise IncompleteBundle(
            f"bundle incomplete: {root} has no {fmt.MANIFEST_NAME}; part files alone never mean "
            "the job finished",
            path=str(root),
        ) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(
                f"{mpath}: the manifest must be a regular file, not a symlink",
                path=fmt.MANIFEST_NAME,
            ) from None
        raise UnreadableFile(
            f"{mpath}: cannot open: {e.strerror}", path=fmt.MANIFEST_NAME
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(
                f"{mpath}: the manifest must be a regular file, not a directory or other",
                path=fmt.MANIFEST_NAME,
            )
        if st.st_size > fmt.MAX_MANIFEST_BYTES:
            raise ManifestInvalid(
                f"{mpath}: {st.st_size} bytes, expected at most {fmt.MAX_MANIFEST_BYTES}",
                path=fmt.MANIFEST_NAME,
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(fmt.MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise UnreadableFile(
            f"{mpath}: cannot read: {e.strerror}", path=fmt.MANIFEST_NAME
        ) from None
    finally:
        os.close(fd)
    return parse_manifest(data, path=str(mpath))


#: Unbound entries reported one by one; beyond this many, one more violation counts the rest.
MAX_LISTED = 1000


def shown(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (kept by Python as surrogates) become
    ``\\xNN``, so a message, a JSON report or a terminal can always carry it."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _unbound_files(root: Path, manifest: Manifest) -> list[BundleError]:
    """Everything in the bundle the manifest does not bind: the root and ``parts/`` only.

    No directory is descended but ``parts/``: an unbound directory is one violation, whatever it
    holds, so the walk is two listings deep whatever the tree (no recursion to exhaust).
    """
    bound = {f.path for f in manifest.bound_files} | {fmt.MANIFEST_NAME}
    errors: list[BundleError] = []
    skipped = 0

    def report(error: BundleError) -> None:
        nonlocal skipped
        if len(errors) < MAX_LISTED:
            errors.append(error)
        else:
            skipped += 1

    def listing(rel_dir: str) -> list[os.DirEntry]:
        d = root / rel_dir if rel_dir else root
        try:
            with os.scandir(d) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError as e:
            report(UnreadableFile(f"{d}: cannot list: {e.strerror}", path=rel_dir or "."))
            return []

    descend = False
    for rel_dir in ("", fmt.PARTS_DIR):
        if rel_dir and not descend:
            break
        for entry in listing(rel_dir):
            rel = shown(f"{rel_dir}/{entry.name}" if rel_dir else entry.name)
            try:
                is_link = entry.is_symlink()
                is_dir = entry.is_dir(follow_symlinks=False)
                links_to_dir = is_link and entry.is_dir()
            except OSError:
                is_link = is_dir = links_to_dir = False
            if links_to_dir:
                report(
                    UnsafePath(
                        f"{root / rel}: a symlinked directory is not allowed in a bundle", path=rel
                    )
                )
            elif is_dir and rel == fmt.PARTS_DIR:
                descend = True
            elif is_dir:
                report(
                    UnboundFile(
                        f"{root / rel}: directory not bound by the manifest "
                        f"(only {fmt.PARTS_DIR}/ may exist)",
                        path=rel,
                    )
                )
            elif rel not in bound:
                report(
                    UnboundFile(
                        f"{root / rel}: file not bound by the manifest; a reader "
                        "could reach it, so epochs would not be reproducible",
                        path=rel,
                    )
                )
    if skipped:
        errors.append(
            UnboundFile(
                f"{root}: {skipped} more unbound entries (the first {MAX_LISTED} are listed)",
                path=".",
            )
        )
    return errors


def _stat_bound(root: Path, manifest: Manifest, errors: list[BundleError]) -> list[FileEntry]:
    present = []
    for entry in manifest.bound_files:
        p = root / entry.path
        try:
            st = p.lstat()
        except (FileNotFoundError, NotADirectoryError):
            errors.append(MissingFile(f"{p}: bound by the manifest but missing", path=entry.path))
            continue
        except OSError as e:
            cls = UnsafePath if e.errno == errno.ELOOP else UnreadableFile
            errors.append(cls(f"{p}: cannot stat: {e.strerror}", path=entry.path))
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
) -> tuple[VerifyStats, set[str]]:
    """Hash the present files in parallel; return the stats and the paths whose bytes match."""
    todo = [e for e in present if not (trusted and trusted(root / e.path, e))]
    total = sum(e.bytes for e in todo)
    done = 0
    lock = threading.Lock()  # ``done += n`` is not atomic across hashing threads

    def on_bytes(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            now = done
        if progress is not None:
            progress(now, total)

    digests = sha256_files([root / e.path for e in todo], on_bytes=on_bytes, return_errors=True)
    intact = {e.path for e in present}
    for entry, digest in zip(todo, digests, strict=True):
        if isinstance(digest, OSError):
            intact.discard(entry.path)
            errors.append(
                UnreadableFile(
                    f"{root / entry.path}: cannot read: {digest.strerror}", path=entry.path
                )
            )
        elif digest != entry.sha256:
            intact.discard(entry.path)
            errors.append(
                DigestMismatch(
                    f"{root / entry.path}: sha256 expected {entry.sha256}, found {digest}",
                    path=entry.path,
                )
            )
    files = manifest.bound_files
    stats = VerifyStats(
        files_total=len(files),
        bytes_total=sum(f.bytes for f in files),
        files_hashed=len(todo),
        bytes_hashed=total,
    )
    return stats, intact


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


@dataclass
class _FileCheck:
    """What one Parquet file's checks found; computed in a worker thread, merged in order."""

    errors: list[BundleError]
    table: pa.Table | None = None  # the id column (and status column of a result part)
    schema_ok: bool = False
    hashes: np.ndarray | None = None  # 64-bit hashes of the ids, for the uniqueness check


def _inspect_file(
    p: Path, entry: FileEntry, expected: pa.Schema, id_field: str, extra: list[str]
) -> _FileCheck:
    """Footer, row count, null ids and schema of one file; reads only the id/status columns.

    Whatever the file holds, the findings are violations: pyarrow's errors on a hostile file are
    reported as an unreadable Parquet file, never raised.
    """
    found = _FileCheck(errors=[])
    try:
        pf = _open_parquet(p, entry, found.errors)
        if pf is None:
            return found
        found.table = _read_ids(p, entry, pf, id_field, extra, found.errors)
        problem = schema_difference(expected, pf.schema_arrow)
        if problem:
            found.errors.append(SchemaMismatch(f"{p}: {problem}", path=entry.path))
        found.schema_ok = problem is None
        if found.table is not None:
            found.hashes = id_hashes(found.table.column(id_field))
    except (pa.ArrowException, OSError, ValueError) as e:
        found.errors.append(
            SchemaMismatch(f"{p}: not a readable Parquet file: {e}", path=entry.path)
        )
        found.table, found.schema_ok, found.hashes = None, False, None
    return found


def _check_parquet(
    root: Path, manifest: Manifest, intact: set[str], errors: list[BundleError]
) -> None:
    """Row counts, schemas, ids and status counts of the files whose bytes are intact.

    Files are read in parallel threads (Parquet decoding and id hashing release the GIL); the
    findings are merged in manifest order, so the error order does not depend on scheduling.
    """
    declared = manifest.schema_.to_arrow()
    id_field = manifest.item_id_field
    is_result = manifest.kind == "result"
    out_schema = pa.schema([pa.field(id_field, pa.string(), nullable=False)])
    jobs = [(entry, declared, [fmt.STATUS_COLUMN] if is_result else []) for entry in manifest.parts]
    if manifest.outstanding is not None:
        jobs.append((manifest.outstanding, out_schema, []))
    todo = [j for j in jobs if j[0].path in intact]
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), cpu_count()))) as pool:
        found = dict(
            zip(
                [j[0].path for j in todo],
                pool.map(
                    lambda j: _inspect_file(root / j[0].path, j[0], j[1], id_field, j[2]), todo
                ),
                strict=True,
            )
        )
    id_arrays: list[tuple[str, pa.ChunkedArray]] = []
    hashes: list[np.ndarray] = []
    status_counts = dict.fromkeys(fmt.STATUSES, 0)
    all_counted = all(e.path in found for e in manifest.parts)  # else counts are not comparable
    for entry, _, _ in jobs:
        f = found.get(entry.path)
        if f is None:
            continue
        errors.extend(f.errors)
        if f.table is not None:
            id_arrays.append((entry.path, f.table.column(id_field)))
            hashes.append(f.hashes)
        if entry is manifest.outstanding:
            continue
        if not f.schema_ok or f.table is None:
            all_counted = False
        elif is_result and not _count_statuses(
            root / entry.path, entry, f.table.column(fmt.STATUS_COLUMN), status_counts, errors
        ):
            all_counted = False
    _check_unique_ids(root, id_field, id_arrays, hashes, errors)
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


def _count_statuses(
    p: Path,
    entry: FileEntry,
    col: pa.ChunkedArray,
    counts: dict[str, int],
    errors: list[BundleError],
) -> bool:
    """Add a part's status counts; return False (and report) if a value is not a status."""
    found, unknown = fmt.count_statuses(col)
    for value, n in unknown.items():
        errors.append(
            CountMismatch(
                f"{p}: {fmt.STATUS_COLUMN} holds {value!r} ({n} rows); "
                f"expected one of {fmt.STATUSES}",
                path=entry.path,
            )
        )
    for status, n in found.items():
        counts[status] += n
    return not unknown


def _check_unique_ids(
    root: Path,
    id_field: str,
    id_arrays: list[tuple[str, pa.ChunkedArray]],
    hashes: list[np.ndarray],
    errors: list[BundleError],
) -> None:
    """Ids must be unique across all parts and the outstanding list (nulls reported already)."""
    n_dups, examples = duplicates([col for _, col in id_arrays], hashes=hashes)
    if not n_dups:
        return
    first = examples[0]
    where = [p for p, col in id_arrays if pc.any(pc.equal(col.cast(pa.string()), first)).as_py()]
    errors.append(
        DuplicateIds(
            f"{root}: {n_dups} id(s) in {id_field!r} appear more than once "
            f"(expected each exactly once), e.g. {first!r} in {', '.join(where)}",
            path=where[0] if where else None,
            count=n_dups,
            examples=examples,
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
