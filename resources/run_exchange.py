"""Where a training run on a Ray cluster meets the Dagster step: one URL every node reaches.

Ranks on other machines share no disk with the step (nor with each other). What they need and
what they make pass through one location (``s3://…`` or any fsspec URL) laid out as::

    <url>/bundles/<version_id>/         the verified input, published once per version
    <url>/runs/<run_id>/index.parquet   the step's saved index: the ranks decode no ids
    <url>/runs/<run_id>/attempt-<k>/    rank 0's checkpoint/ files, then outcome.json last
                                        (one folder per attempt: a restarted fit never
                                        meets a killed attempt's half-published files)
    <url>/runs/<run_id>/heartbeat       a counter the step raises while it waits (the tether)
    <url>/progress/<key>/               the fit's mid-fit cuts, readable by every node

Everything is published with the bundle store's rules (nothing overwritten, the marker last),
and what comes back is checked against the digests the outcome names before the step trusts it.
Credentials are references, resolved by each process's own registry.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.bundle.atomic import READ_ONLY, atomic_write_bytes
from pipeline.bundle.digest import content_sha256, sha256_file
from pipeline.bundle.errors import DigestMismatch
from pipeline.bundle.verify import VerifiedSnapshot
from pipeline.readers.index import Index
from pipeline.training.runner import CHECKPOINT_DIR, OUTCOME, TrainSummary
from resources.bundle_store import BundleStore

INDEX_NAME = "index.parquet"
HEARTBEAT_NAME = "heartbeat"


class Untethered(RuntimeError):
    """The step that started a job on the cluster stopped beating: nobody waits for the job."""


@contextmanager
def heartbeat(
    store: BundleStore, url: str, every: float, credential_ref: str | None = None
) -> Iterator[None]:
    """Raise a counter at ``url`` every ``every`` seconds while the block runs (first at once).

    A job on other machines cannot see the step's process; it sees the counter stop rising when
    the step is gone, however it went (a SIGKILL included), and stops (:class:`Tether`).
    """
    fs, path = store.open_location(url, credential_ref)
    stop = threading.Event()
    beat = [0]

    def write() -> None:
        beat[0] += 1
        fs.pipe_file(path, str(beat[0]).encode())

    write()

    def loop() -> None:
        while not stop.wait(every):
            try:
                write()
            except Exception:  # a missed beat is retried at the next; only silence counts
                pass

    thread = threading.Thread(target=loop, name="lithi-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class Tether:
    """The job's side of :func:`heartbeat`: :meth:`check` raises :class:`Untethered` once the
    counter has not changed for ``timeout`` seconds of this process's own clock (no clocks of
    two machines are compared)."""

    def __init__(
        self, store: BundleStore, url: str, timeout: float, credential_ref: str | None = None
    ) -> None:
        self.fs, self.path = store.open_location(url, credential_ref)
        self.url, self.timeout = url, timeout
        self.every = max(0.5, timeout / 6)
        self._seen: bytes | None = None
        self._changed = self._read_at = time.monotonic()

    def check(self) -> None:
        now = time.monotonic()
        if now - self._read_at < self.every:
            return
        self._read_at = now
        try:
            beat = self.fs.cat_file(self.path)
        except FileNotFoundError:
            beat = None
        if beat != self._seen:
            self._seen, self._changed = beat, now
        elif now - self._changed > self.timeout:
            raise Untethered(
                f"{self.url}: no heartbeat from the step that started this job for "
                f"{now - self._changed:.0f} s; it is gone, so the training stops"
            )


@dataclass(frozen=True)
class RunExchange:
    """The exchange URLs of one training run (see the module doc for the layout)."""

    url: str
    run_id: str
    version_id: str
    progress_key: str

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.url.rstrip("/"), *parts)

    @property
    def bundle_url(self) -> str:
        return self._join("bundles", self.version_id)

    @property
    def run_url(self) -> str:
        return self._join("runs", self.run_id)

    @property
    def index_url(self) -> str:
        return self._join("runs", self.run_id, INDEX_NAME)

    def attempt_url(self, attempt: int) -> str:
        return self._join("runs", self.run_id, f"attempt-{attempt}")

    @property
    def heartbeat_url(self) -> str:
        return self._join("runs", self.run_id, HEARTBEAT_NAME)

    @property
    def progress_url(self) -> str:
        return self._join("progress", self.progress_key)


def publish_inputs(
    store: BundleStore,
    exchange: RunExchange,
    snapshot: VerifiedSnapshot,
    index: Index,
    credential_ref: str | None = None,
) -> None:
    """Publish the verified bundle (a no-op once that version is there) and the saved index."""
    store.upload(snapshot, exchange.bundle_url, credential_ref=credential_ref)
    with tempfile.TemporaryDirectory(prefix="lithi-index-") as tmp:
        path = Path(index.saved_at) if index.saved_at else Path(tmp) / INDEX_NAME
        if not index.saved_at:
            index.save(path)
        store.upload_files(
            {INDEX_NAME: path}, exchange.run_url, last=INDEX_NAME, credential_ref=credential_ref
        )


def load_index(
    store: BundleStore,
    exchange: RunExchange,
    snapshot: VerifiedSnapshot,
    scratch: Path,
    credential_ref: str | None = None,
) -> Index:
    """The run's saved index, downloaded into ``scratch`` and bound to ``snapshot`` (its
    digest and the bundle's identity checked by :meth:`Index.load`)."""
    fs, path = store.open_location(exchange.index_url, credential_ref)
    local = scratch / INDEX_NAME
    atomic_write_bytes(local, fs.cat_file(path))
    return Index.load(local, snapshot=snapshot)


def publish_outcome(
    store: BundleStore,
    url: str,
    out: Path,
    summary: TrainSummary,
    credential_ref: str | None = None,
) -> None:
    """Rank 0's checkpoint files, then ``outcome.json`` last, under ``url`` (an attempt's)."""
    files = {
        f"{CHECKPOINT_DIR}/{rel}": out / CHECKPOINT_DIR / rel for rel in summary.checkpoint.files
    }
    digests = {f"{CHECKPOINT_DIR}/{rel}": d for rel, d in summary.checkpoint.files.items()}
    files[OUTCOME] = out / OUTCOME
    store.upload_files(files, url, last=OUTCOME, digests=digests, credential_ref=credential_ref)


def collect_outcome(
    store: BundleStore, url: str, out: Path, credential_ref: str | None = None
) -> TrainSummary:
    """Download the outcome at ``url`` and checkpoint into ``out`` and check every file against the
    digests the outcome names (and their digest over all); the summary, once all match."""
    fs, root = store.open_location(url, credential_ref)
    raw = fs.cat_file(posixpath.join(root, OUTCOME))
    summary = TrainSummary.model_validate_json(raw)
    for rel, expected in summary.checkpoint.files.items():
        dest = out / CHECKPOINT_DIR / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        os.close(fd)
        fs.get_file(posixpath.join(root, CHECKPOINT_DIR, rel), tmp)
        found = sha256_file(tmp)
        if found != expected:
            os.unlink(tmp)
            raise DigestMismatch(
                f"{url}/{CHECKPOINT_DIR}/{rel}: sha256 {found}, the outcome names {expected}",
                path=f"{CHECKPOINT_DIR}/{rel}",
            )
        os.chmod(tmp, READ_ONLY)
        os.replace(tmp, dest)
    total = content_sha256((d, r) for r, d in summary.checkpoint.files.items())
    if total != summary.checkpoint.sha256:
        raise DigestMismatch(
            f"{url}: the checkpoint's files hash to {total}, the outcome names "
            f"{summary.checkpoint.sha256}",
            path=CHECKPOINT_DIR,
        )
    atomic_write_bytes(out / OUTCOME, raw)
    return summary
