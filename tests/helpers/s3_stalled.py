"""A fetch or an upload that stalls mid-way, for a test to kill with SIGKILL at a known point.

    python -m tests.helpers.s3_stalled fetch URL CACHE_DIR PART CHUNK_BYTES
    python -m tests.helpers.s3_stalled upload BUNDLE_DIR URL

``fetch`` downloads the bundle at ``URL`` into ``CACHE_DIR`` in chunks of ``CHUNK_BYTES``; once
the first chunk of ``PART`` is read (and so in its partial file), the next read of it hangs like
a dead connection: the process prints ``STALLED`` and waits. ``upload`` publishes the local bundle
to ``URL``; once one file has been written, every further write prints ``STALLED`` and never
returns, so the manifest is never reached. The test reads the line, kills the process and looks
at what the kill left behind. The store's endpoint and the credential come from the environment,
as for any user's process.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import s3fs

from pipeline.bundle.verify import verify
from resources import bundle_store
from resources.bundle_store import BundleStore
from resources.credentials import CredentialRegistry
from tests.helpers.s3 import REF, SECRET_ENV


def _stalled() -> None:
    print("STALLED", flush=True)


def fetch(url: str, cache: str, part: str, chunk_bytes: int) -> None:
    """Fetch ``url``, the response body of ``part`` hanging once one chunk of it was read."""
    opened, read = bundle_store._S3Stream.__init__, bundle_store._S3Stream.read
    read_of_part: dict[int, int] = {}  # bytes read so far, by the id of the part's stream

    def note_part(self, fs, path, start):
        opened(self, fs, path, start)
        if path.endswith(part):
            read_of_part[id(self)] = 0

    def hang_mid_part(self, n):
        if read_of_part.get(id(self), 0) >= chunk_bytes:
            _stalled()
            threading.Event().wait()  # a connection that hangs, until the test kills us
        pieces = read(self, n)
        if id(self) in read_of_part:
            read_of_part[id(self)] += sum(len(p) for p in pieces)
        return pieces

    bundle_store._S3Stream.__init__ = note_part
    bundle_store._S3Stream.read = hang_mid_part
    store = BundleStore(cache, CredentialRegistry({REF: SECRET_ENV}), chunk_bytes=chunk_bytes)
    store.fetch(url, credential_ref=REF)
    raise SystemExit(f"{url}: the fetch finished; {part} was meant to stall")


def upload(bundle: str, url: str) -> None:
    """Upload the bundle at ``bundle`` to ``url``, stalling once one file is written."""
    put_file = s3fs.S3FileSystem._put_file
    written = 0

    async def stall_after_one(self, lpath, rpath, *args, **kwargs):
        nonlocal written
        if written:
            _stalled()
            await asyncio.Event().wait()  # until the test kills this process
        out = await put_file(self, lpath, rpath, *args, **kwargs)
        written += 1
        return out

    s3fs.S3FileSystem._put_file = stall_after_one
    store = BundleStore(Path(bundle).parent / "cache", CredentialRegistry({REF: SECRET_ENV}))
    store.upload(verify(bundle), url, credential_ref=REF)
    raise SystemExit(f"{url}: the upload finished; it was meant to stall")


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "fetch":
        fetch(args[0], args[1], args[2], int(args[3]))
    else:
        upload(args[0], args[1])
