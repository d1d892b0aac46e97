"""The one place a digest is computed: file sha256, parallel hashing, and ``content_sha256``.

``content_sha256`` is defined so anyone can check a bundle with coreutils alone: it is the sha256
of the text ``sha256sum`` prints for the bound files in manifest order, ``<hex>  <path>\\n`` each.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, overload

#: Read size: large enough that hashlib releases the GIL for every update, small enough that the
#: buffer stays in cache (``bench/verify.py`` measures the effect).
CHUNK = 1024 * 1024


_hashed = 0
_hashed_lock = threading.Lock()


def file_bytes_hashed() -> int:
    """Bytes of files this process has hashed so far: what a verification or a rebuild cost.

    Read it before and after a piece of work to measure it (``bench/chain.py``, the rebuild-cost
    tests); it only ever grows.
    """
    return _hashed


def _count(n: int) -> None:
    global _hashed
    with _hashed_lock:
        _hashed += n


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Sha256Stream:
    """The sha256 of bytes fed as they arrive (a download), counted in :func:`file_bytes_hashed`
    like a file's: a file hashed while it is written need not be read back to be checked."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def update(self, data: bytes | memoryview) -> None:
        self._h.update(data)  # hashlib releases the GIL for large updates
        _count(len(data))

    def update_file(
        self, path: str | os.PathLike[str], on_bytes: Callable[[int], None] | None = None
    ) -> None:
        """Feed a whole file, read in large chunks into one buffer."""
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                self.update(view[:n])
                if on_bytes is not None:
                    on_bytes(n)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def sha256_file(path: str | os.PathLike[str], on_bytes: Callable[[int], None] | None = None) -> str:
    """Return the lowercase hex sha256 of a file, reading it in large chunks into one buffer."""
    h = Sha256Stream()
    h.update_file(path, on_bytes=on_bytes)
    return h.hexdigest()


@overload
def sha256_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    workers: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    return_errors: Literal[False] = False,
) -> list[str]: ...


@overload
def sha256_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    workers: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    return_errors: Literal[True],
) -> list[str | OSError]: ...


def sha256_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    workers: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    return_errors: bool = False,
) -> list[str] | list[str | OSError]:
    """Hash many files in parallel threads, returning digests in the order of ``paths``.

    sha256 of one file is sequential, so parallelism is across files: largest first, so the
    last file to finish is a small one and no core idles through a long tail. With
    ``return_errors`` a file that cannot be read yields its ``OSError`` in its place instead of
    raising, so a verification can report it beside the others.
    """
    if not paths:
        return []

    def one(p: str | os.PathLike[str]) -> str | OSError:
        try:
            return sha256_file(p, on_bytes)
        except OSError as e:
            if not return_errors:
                raise
            return e

    workers = workers or min(len(paths), cpu_count())
    if workers <= 1:
        return [one(p) for p in paths]
    order = sorted(range(len(paths)), key=lambda i: -_size(paths[i]))
    digests: list[str | OSError] = [""] * len(paths)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sha256") as pool:
        futures = {pool.submit(one, paths[i]): i for i in order}
        for fut, i in futures.items():
            digests[i] = fut.result()
    return digests


def _size(path: str | os.PathLike[str]) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # sha256_file raises the real error


def sha256_bytes(data: bytes) -> str:
    """Return the lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_buffers(buffers: Iterable[bytes | memoryview]) -> str:
    """The sha256 of the buffers concatenated, without concatenating them (no copy: a digest
    over ten million ids would otherwise hold two more copies of them)."""
    h = hashlib.sha256()
    for b in buffers:
        h.update(b)
    return h.hexdigest()


def sha256sum_text(entries: Iterable[tuple[str, str]]) -> str:
    """The text ``sha256sum`` prints for ``(sha256, relative path)`` pairs, in the given order."""
    return "".join(f"{digest}  {path}\n" for digest, path in entries)


def content_sha256(entries: Iterable[tuple[str, str]]) -> str:
    """The bundle digest: sha256 of :func:`sha256sum_text` over the bound files, in order."""
    return sha256_bytes(sha256sum_text(entries).encode())
