"""The one place a digest is computed: file sha256, parallel hashing, and ``content_sha256``.

``content_sha256`` is defined so anyone can check a bundle with coreutils alone: it is the sha256
of the text ``sha256sum`` prints for the bound files in manifest order, ``<hex>  <path>\\n`` each.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

CHUNK = 4 * 1024 * 1024


def sha256_file(path: str | os.PathLike[str], on_bytes: Callable[[int], None] | None = None) -> str:
    """Return the lowercase hex sha256 of a file, reading it in large chunks into one buffer."""
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])  # hashlib releases the GIL for large updates
            if on_bytes is not None:
                on_bytes(n)
    return h.hexdigest()


def sha256_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    workers: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> list[str]:
    """Hash many files in parallel threads, returning digests in the order of ``paths``."""
    if not paths:
        return []
    workers = workers or min(len(paths), os.cpu_count() or 1)
    if workers <= 1:
        return [sha256_file(p, on_bytes) for p in paths]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sha256") as pool:
        return list(pool.map(lambda p: sha256_file(p, on_bytes), paths))


def sha256_bytes(data: bytes) -> str:
    """Return the lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256sum_text(entries: Iterable[tuple[str, str]]) -> str:
    """The text ``sha256sum`` prints for ``(sha256, relative path)`` pairs, in the given order."""
    return "".join(f"{digest}  {path}\n" for digest, path in entries)


def content_sha256(entries: Iterable[tuple[str, str]]) -> str:
    """The bundle digest: sha256 of :func:`sha256sum_text` over the bound files, in order."""
    return sha256_bytes(sha256sum_text(entries).encode())
