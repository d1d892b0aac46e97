"""Crash-safe file system primitives: fsync, atomic write, and a rename that never replaces.

Everything that publishes a file another process may read goes through here, so "nothing lost or
half-written on a crash" is implemented once.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.bundle.leftovers import work_name

#: Whether :func:`fsync_file` and :func:`fsync_dir` reach the disk. Always on in the product.
#: The test suite turns it off (``tests/conftest.py``) except for the crash tests: no other test
#: can observe a flush (only a power loss can), and every staged file costs several.
DURABLE = True

#: Mode of every published file (bundle files, cache objects, checkpoints): read-only for
#: everyone. Bundle parts are hard-linked between versions, so a write in place would change
#: several versions at once.
READ_ONLY = 0o444
_WRITE_BITS = 0o222

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_renameat2: Callable[[int, bytes, int, bytes, int], int] | None
try:
    _fn = ctypes.CDLL(None, use_errno=True).renameat2
    _fn.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    _renameat2 = _fn
except (OSError, AttributeError):  # not glibc / not Linux
    _renameat2 = None

_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Callable[[int, int, int, int], int] | None
try:
    _fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    _fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range = _fn
except (OSError, AttributeError):  # not glibc / not Linux
    _sync_file_range = None


def is_read_only(mode: int) -> bool:
    """Whether a file mode (an ``st_mode``) lets nobody write."""
    return not mode & _WRITE_BITS


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry so a rename or create inside it survives a crash."""
    if not DURABLE:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data to stable storage."""
    if not DURABLE:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a range of an open file to the disk, without waiting.

    Nothing is promised durable by it (only :func:`fsync_file` does that), but the fsync that
    follows then waits for the last writes only, not for the whole file: a file written in
    chunks reaches the disk while later chunks are still arriving (``bench/s3.py`` measures
    it). A no-op where the call is missing (not Linux).
    """
    if DURABLE and _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # advisory: result unused


def rename_noreplace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename ``src`` to ``dst``, failing with ``FileExistsError`` if ``dst`` exists in any form.

    Plain ``rename`` silently replaces an empty directory or a file; ``renameat2`` with
    ``RENAME_NOREPLACE`` makes "a name that cannot already exist" atomic.
    """
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):  # EINVAL: file system lacks the flag
            raise OSError(err, os.strerror(err), os.fspath(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", os.fspath(dst))
    os.rename(src, dst)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; on success fsync it and rename it to
    ``path`` in one step, on any error remove it. A reader sees the old file or the whole new one.

    With ``replace=False`` the rename fails with ``FileExistsError`` if ``path`` already exists.
    """
    path = Path(path)
    tmp = work_name(path, "tmp")
    try:
        yield tmp
        fsync_file(tmp)
        if replace:
            os.replace(tmp, path)
        else:
            rename_noreplace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, replace: bool = True) -> None:
    """Write ``data`` to ``path`` through a fsynced temporary sibling and one rename.

    With ``replace=False`` the write fails with ``FileExistsError`` if ``path`` already exists.
    """
    with atomic_path(path, replace=replace) as tmp, open(tmp, "xb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, replace: bool = True) -> None:
    """Write ``text`` (UTF-8) atomically; see :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode(), replace=replace)


def make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing ancestors; return those this call created, deepest
    last, so a failed publication can remove them again with :func:`remove_created`."""
    missing: list[Path] = []
    d = directory
    while not os.path.lexists(d):
        missing.append(d)
        d = d.parent
    created: list[Path] = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:  # another process made it: not ours to remove
            continue
        except BaseException:
            remove_created(created)
            raise
        created.append(d)
    return created


def remove_created(created: list[Path]) -> None:
    """Remove directories :func:`make_parents` created, deepest first, while they are empty."""
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            return  # not empty (someone else's files arrived) or already gone: leave the rest
