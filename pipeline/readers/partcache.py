"""Decoded parts shared by one rank's DataLoader workers: each part is decoded once per rank.

A shuffled map-style batch touches every part of the rank's share, so without sharing each
worker decodes the whole share on its first batches (2 workers: everything twice) and keeps its
own decoded copy. :class:`SharedParts` is a private directory (``/dev/shm`` when there is one)
created by the process that builds the dataset, before the DataLoader starts its workers. The
first worker to need a part takes that part's lock (``flock``, released by the kernel if the
worker dies), decodes it and publishes it as an uncompressed Arrow IPC file (written under a
temporary name, then renamed); every worker memory-maps the published file, zero-copy, so the
decoded pages exist once and are shared. A worker that finds a part locked decodes another part
it needs meanwhile and waits only when nothing else is left.

Only the owning process removes the directory: when the owner is garbage-collected or its
interpreter exits (``weakref.finalize``). A worker's crash leaves at most a temporary file
inside it, removed with it. A directory whose owner was killed outright (SIGKILL, or a SIGTERM
with no handler) is removed by the next :class:`SharedParts` the same user creates in the same
pid namespace (:func:`sweep_stale`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from pipeline.bundle.leftovers import pid_alive

try:  # POSIX only; without it every worker decodes for itself, as before
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]  # None is how available() tells no flock

#: Directory names start with this, then the owner's pid namespace and pid:
#: ``lithi-parts-<pidns>-<pid>-<random>`` (a pid means something only in its own namespace).
PREFIX = "lithi-parts-"
#: Schema metadata key of a published part: what it was decoded from (checked on every open).
TAG_KEY = b"lithi.decoded_part"

_swept: set[str] = set()  # roots this process has already cleaned of dead owners' directories


class SharedPartMismatch(RuntimeError):
    """A published part does not say it was decoded from the part this reader asked for."""


def available() -> bool:
    """Whether this platform has what sharing needs (``flock``)."""
    return fcntl is not None


#: Where the shared directories go, when set: a machine whose ``/dev/shm`` is small (a
#: container's default is 64 MiB) or shared with strangers points it at storage of its own.
ROOT_ENV = "LITHI_SHARED_PARTS_DIR"


def default_root() -> str:
    """``$LITHI_SHARED_PARTS_DIR`` if set; else ``/dev/shm`` (memory, so a published part costs
    no disk I/O) if usable, else the temp dir."""
    chosen = os.environ.get(ROOT_ENV)
    if chosen:
        os.makedirs(chosen, exist_ok=True)
        return chosen
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def sweep_stale(root: str) -> list[str]:
    """Remove this user's cache directories under ``root`` whose owner process no longer exists.

    Returns the removed paths. Only names this module creates are touched, only those owned by
    the calling user and made in this pid namespace (``/dev/shm`` may be shared with other
    containers), and only when the pid in the name is not a running process.
    """
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    uid = os.getuid()
    mine = f"{PREFIX}{_pid_namespace()}-"
    for name in names:
        if not name.startswith(mine):
            continue
        pid_text = name[len(mine) :].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        path = os.path.join(root, name)
        try:
            if os.lstat(path).st_uid != uid or pid_alive(int(pid_text)):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _pid_namespace() -> str:
    try:  # e.g. "pid:[4026531836]"
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]") or "0"
    except OSError:
        return "0"


def _remove(path: str, owner_pid: int) -> None:
    # a forked worker inherits the owner's finalizer; only the owner may remove the directory
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


class SharedParts:
    """A directory of decoded parts, shared by the processes forked or spawned from its owner.

    ``tags[p]`` names what part ``p`` is decoded from (the snapshot, the part's path and sha256,
    the columns, and ``rows``); it is written into every published file and compared on every
    open, with the row count, so a file can only ever serve the part, columns and snapshot it
    was decoded from.
    """

    def __init__(self, tags: list[dict[str, Any]], root: str | None = None) -> None:
        root = root or default_root()
        if root not in _swept:
            _swept.add(root)
            sweep_stale(root)
        prefix = f"{PREFIX}{_pid_namespace()}-{os.getpid()}-"
        self.path = tempfile.mkdtemp(prefix=prefix, dir=root)  # mode 0700
        self._tags = [json.dumps(t, sort_keys=True).encode() for t in tags]
        self._rows = [t.get("rows") for t in tags]
        self._owner_pid = os.getpid()
        self._full = False  # this process could not publish (e.g. /dev/shm full): stop trying
        self._finalizer = weakref.finalize(self, _remove, self.path, self._owner_pid)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_finalizer"]  # a spawned worker's copy never owns the directory
        state["_full"] = False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def close(self) -> None:
        """Remove the directory now (in the owner; elsewhere a no-op). Idempotent."""
        finalizer = self.__dict__.get("_finalizer")
        if finalizer is not None:
            finalizer()

    def _file(self, p: int) -> str:
        return os.path.join(self.path, f"{p}.arrow")

    def published(self) -> list[int]:
        """The parts published so far, in part order."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        return sorted(int(n[:-6]) for n in names if n.endswith(".arrow") and n[:-6].isdigit())

    def tables(
        self, parts: Iterable[int], decode: Callable[[int], pa.Table]
    ) -> dict[int, pa.Table]:
        """Each of ``parts`` as a table, memory-mapped from its published file.

        Parts not yet published are decoded here with ``decode(p)`` and published, unless
        another process holds that part's lock: those are done last, after waiting for the
        lock (by then usually published). A part that cannot be published (no space, the
        directory gone) is returned as decoded, private to this process.
        """
        out: dict[int, pa.Table] = {}
        busy: list[int] = []
        for p in parts:
            table = self._open(p)
            if table is None:
                table = self._claim(p, decode, wait=False)
            if table is None:
                busy.append(p)
            else:
                out[p] = table
        for p in busy:
            table = self._claim(p, decode, wait=True)
            assert table is not None  # only a claim that does not wait comes back empty
            out[p] = table
        return out

    def _open(self, p: int) -> pa.Table | None:
        try:
            source = pa.memory_map(self._file(p), "r")
        except FileNotFoundError:
            return None
        table = ipc.open_file(source).read_all()  # zero-copy: buffers point into the mapping
        meta = dict(table.schema.metadata or {})
        tag = meta.pop(TAG_KEY, None)
        if tag != self._tags[p]:
            raise SharedPartMismatch(
                f"{self._file(p)}: published for {tag!r}, expected part {p} as {self._tags[p]!r}"
            )
        if self._rows[p] is not None and table.num_rows != self._rows[p]:
            raise SharedPartMismatch(
                f"{self._file(p)}: {table.num_rows} rows, part {p} has {self._rows[p]}"
            )
        return table.replace_schema_metadata(meta or None)

    def _claim(self, p: int, decode: Callable[[int], pa.Table], *, wait: bool) -> pa.Table | None:
        if fcntl is None or self._full:
            return decode(p)
        try:
            fd = os.open(os.path.join(self.path, f"{p}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:  # the directory is gone (the owner is exiting): decode privately
            return decode(p)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            table = self._open(p)  # published while we waited, or before we locked
            if table is not None:
                return table
            table = decode(p)
            if not self._publish(p, table):
                return table
            # the private copy is dropped: from here on the shared pages serve it
            shared = self._open(p)
            return table if shared is None else shared
        finally:
            os.close(fd)  # releases the lock

    def _publish(self, p: int, table: pa.Table) -> bool:
        final = self._file(p)
        tmp = f"{final}.{os.getpid()}.tmp"
        meta = dict(table.schema.metadata or {})
        meta[TAG_KEY] = self._tags[p]
        try:
            with pa.OSFile(tmp, "wb") as sink:
                with ipc.new_file(sink, table.schema.with_metadata(meta)) as writer:
                    writer.write_table(table.replace_schema_metadata(meta))
            os.rename(tmp, final)  # atomic: a reader sees the whole file or none
            return True
        except OSError:  # no space left on /dev/shm, or the directory was removed
            self._full = True
            with suppress(OSError):
                os.unlink(tmp)
            return False
