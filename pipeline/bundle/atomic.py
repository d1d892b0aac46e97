"""Crash-safe file system primitives: fsync, atomic write, and a rename that never replaces.

Everything that publishes a file another process may read goes through here, so "nothing lost or
half-written on a crash" is implemented once.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2 = _libc.renameat2
    _renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
except (OSError, AttributeError):  # not glibc / not Linux
    _renameat2 = None


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry so a rename or create inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
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
