"""The bundle directory as files: the manifest opened safely, nothing unbound, every bound file
present, regular, of its size and of its sha256.

The first stages of verification (``verify`` runs them in this order). None of them reads
Parquet: a file's contents are looked at only once its bytes are known to be the bound ones.
Each stage returns what it found; none raises on a bundle's contents (only
:func:`read_manifest` does, since nothing else can be checked without a manifest).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import sha256_files
from pipeline.bundle.errors import (
    BundleError,
    DigestMismatch,
    IncompleteBundle,
    ManifestInvalid,
    MissingFile,
    SizeMismatch,
    UnboundFile,
    UnreadableFile,
    UnsafePath,
)
from pipeline.bundle.manifest import FileEntry, Manifest, parse_manifest

#: ``trusted(path, entry) -> bool``: may vouch that ``path`` already holds ``entry``'s exact bytes
#: (e.g. a read-only, content-addressed cache object verified before), so it is not hashed again.
TrustFn = Callable[[Path, FileEntry], bool]
#: ``progress(bytes_done, bytes_total)``, called from hashing threads.
ProgressFn = Callable[[int, int], None]
#: Unbound entries reported one by one; beyond this many, one more violation counts the rest.
MAX_LISTED = 1000


@dataclass(frozen=True)
class VerifyStats:
    """What a verification actually read: the cost of a rebuild is measured here."""

    files_total: int
    bytes_total: int
    files_hashed: int
    bytes_hashed: int


def read_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``result-manifest.json``; no manifest means the bundle is incomplete.

    The manifest is opened without following a symlink and without blocking on a FIFO, must be a
    regular file, and is read only up to ``MAX_MANIFEST_BYTES`` (see
    :func:`~pipeline.bundle.manifest.parse_manifest`).
    """
    return parse_manifest(read_manifest_bytes(root), path=str(Path(root) / fmt.MANIFEST_NAME))


def read_manifest_bytes(root: str | os.PathLike[str]) -> bytes:
    """The text of ``root``'s manifest, read as :func:`read_manifest` reads it (not parsed)."""
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
    return data


def shown(name: str) -> str:
    """A file name as text: bytes that are not UTF-8 (kept by Python as surrogates) become
    ``\\xNN``, so a message, a JSON report or a terminal can always carry it."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def unbound_files(root: Path, manifest: Manifest) -> list[BundleError]:
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

    def listing(rel_dir: str) -> list[os.DirEntry[str]]:
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


def stat_bound(root: Path, manifest: Manifest) -> tuple[list[FileEntry], list[BundleError]]:
    """The bound files present as regular files of their bound size, and what is wrong with the
    others (missing, a symlink, not regular, unreadable, another size)."""
    present: list[FileEntry] = []
    errors: list[BundleError] = []
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
    return present, errors


def unsafe_paths(root: Path, manifest: Manifest) -> list[BundleError]:
    """What :func:`~pipeline.bundle.verify.verify` refuses by path and file type alone (a
    symlink, a FIFO, a symlinked ``parts/``): no file is opened or hashed, so a command that only
    shows a bundle (``inspect``) applies the same rules first."""
    errors = unbound_files(root, manifest) + stat_bound(root, manifest)[1]
    return [e for e in errors if isinstance(e, UnsafePath)]


@dataclass(frozen=True)
class Hashed:
    """What :func:`hash_bound` found: the cost, the files whose bytes match, the violations."""

    stats: VerifyStats
    intact: set[str]
    errors: list[BundleError]


def hash_bound(
    root: Path,
    manifest: Manifest,
    present: list[FileEntry],
    trusted: TrustFn | None,
    progress: ProgressFn | None,
) -> Hashed:
    """Hash the present files in parallel, except those ``trusted`` vouches for."""
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
    errors: list[BundleError] = []
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
    return Hashed(stats, intact, errors)
