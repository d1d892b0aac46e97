"""The bundle store: fetch a bundle from any fsspec location into a content-addressed local cache.

A bundle is downloaded once. Its manifest is read first (no manifest, nothing else is read);
every bound file lands in ``objects/<sha256>`` after its digest and size are checked, read-only,
and a ledger entry records that it was hashed on arrival. A bundle is then materialised as a view
``bundles/<version_id>/`` of hard links to those objects, so a newer version that binds parts an
older one already had costs only its new parts in download and in hashing: :meth:`trusted` lets
``pipeline.bundle.verify.verify`` skip files that are provably the verified objects.

A download cannot lie. The manifest is read first and again last: a bundle whose manifest
changed while its files arrived is refused (:class:`ManifestChanged`), and no view of it is made.
Files arrive in parallel, each streamed in reads of ``chunk_bytes`` (memory stays bounded by
workers x chunk, whatever the part sizes) into ``incoming/<sha256>``, a name the cache never
trusts; only a file whose size and sha256 match the manifest is renamed into ``objects/``. A fetch
that dies mid-file leaves its partial file there, and the next fetch continues it from where it
stopped with a ranged read (each file is hashed as it is written, a kept prefix read back from
the disk first, so a stale or damaged prefix is caught and the file is fetched once more from the
start); a file whose bytes do not match is refused by name, and one that does is flushed to the
disk before it is renamed.

Any number of processes may fetch into one cache at once. Objects are content-addressed and
arrive by an atomic rename that never replaces, so racing downloads of one file are harmless; a
partial file is continued by one fetcher at a time (an OS file lock per object). A view is built
and published under a lock per version (``locks/<version_id>.lock``, an OS file lock the kernel
releases if its holder dies): the first fetcher materialises it, the others find it current and
return it, and a published view is only ever retired when it is stale (it links an object that
was found tampered with and replaced), never because another process is busy.

A local bundle on the cache's own file system is not copied at all where its producer made its
files read-only (as ``stage`` and the local Compute do): each such file becomes an object by a
hard link, hashed once as a download is, and no byte is written (:meth:`BundleStore._link`;
``link=False`` copies every file). The object is then the source file itself, so an edit to
the source in place (which takes a ``chmod`` first, and so moves its ctime) is an edit to the
cache: the ledger stops vouching for it and the bundle is refused by name, never read, and is
not healed from a source that changed either. A copy outlives such an edit.

:meth:`BundleStore.upload` publishes a bundle of the cache to any fsspec location (an ``s3://``
prefix): every part first, ``result-manifest.json`` last and only if none is there, so a reader
never sees half a bundle, uploading the same bundle again is a no-op, and a different bundle
already at the location is never overwritten (:meth:`BundleStore.upload_files`: the same for a
run's checkpoint and records).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import secrets
import shutil
import stat
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import filelock
import fsspec
from fsspec.asyn import sync
from fsspec.utils import get_protocol
from pydantic import BaseModel, ConfigDict

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import (
    READ_ONLY,
    atomic_write_bytes,
    atomic_write_text,
    fsync_dir,
    fsync_file,
    is_read_only,
    rename_noreplace,
    start_writeback,
)
from pipeline.bundle.digest import (
    Sha256Stream,
    cpu_count,
    sha256_buffers,
    sha256_bytes,
    sha256_file,
)
from pipeline.bundle.errors import (
    BundleError,
    BundleExists,
    DigestMismatch,
    IncompleteBundle,
    SizeMismatch,
    UnsafePath,
)
from pipeline.bundle.files import read_manifest_bytes, unsafe_paths
from pipeline.bundle.fingerprint import Fingerprint, matches
from pipeline.bundle.leftovers import owned_name, sweep
from pipeline.bundle.manifest import FileEntry, Manifest, parse_manifest
from pipeline.bundle.receipt import check_once
from pipeline.bundle.verify import CheckResult, VerifiedSnapshot, check
from resources.credentials import CredentialRegistry, UnknownCredential

#: The most one ``write`` of a download hands the kernel: writes of 1 MiB and more cost several
#: times the system time per byte on the machine bench/s3.py was measured on (likely the larger
#: page-cache folios backing them), far more than the extra calls (docs/performance.md).
_WRITE_BYTES = 128 * 1024

#: One read of a download: what each worker holds in memory at a time.
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024


def default_remote_workers() -> int:
    """Downloads in flight from a remote store: two per core this process may use, 4 to 16.

    A transfer mostly waits on the network, hashing each chunk as it arrives; more transfers
    than that only make the hashing threads take turns (``bench/s3.py --workers`` compares).
    Memory stays bounded by this many chunks.
    """
    return max(4, min(16, 2 * cpu_count()))


class ManifestChanged(BundleError):
    """The bundle's manifest changed while its files were downloaded: nothing of it is viewed."""


class SourceBundle(BaseModel):
    """A bundle to read, known by its manifest only: where it is and what it binds.

    What the chain's first link hands on: nothing but the manifest has been read, so nothing is
    trusted yet; :meth:`BundleStore.fetch` downloads and hashes what it binds.
    """

    model_config = ConfigDict(frozen=True)

    url: str
    credential_ref: str | None = None
    manifest: Manifest


@dataclass(frozen=True)
class FetchResult:
    """A fetched bundle's local view and what fetching it cost (bound files only)."""

    path: Path
    manifest: Manifest
    bytes_downloaded: int  # transferred by this fetch
    files_downloaded: int
    files_reused: int
    bytes_hashed: int  # hashed on arrival (downloads, plus any cache object re-checked)
    bytes_resumed: int = 0  # of partial files an interrupted fetch left, kept, not sent again
    files_linked: int = 0  # of files_downloaded, hard-linked from a local source: no bytes copied


@dataclass(frozen=True)
class UploadResult:
    """Where a bundle was published, and what publishing it cost this time."""

    url: str
    files_uploaded: int
    bytes_uploaded: int
    files_present: int  # already there with the same bytes (a retry after a crash)
    already_published: bool  # the same manifest was there: nothing was written


def is_remote(location: str) -> bool:
    """Whether ``location`` is a URL of a store other than this machine's files (``s3://``)."""
    return "://" in location.split("::")[-1] and get_protocol(location) not in ("file", "local")


class BundleStore:
    """A content-addressed cache of bundles fetched from URLs or plain paths through fsspec."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        credentials: CredentialRegistry | None = None,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        remote_workers: int | None = None,
        rehash: bool = False,
        link: bool = True,
    ):
        remote_workers = remote_workers or default_remote_workers()
        if chunk_bytes < 1 or remote_workers < 1:
            raise ValueError("chunk_bytes and remote_workers must be at least 1")
        self.cache_dir = Path(cache_dir).resolve()
        self.credentials = credentials
        self.chunk_bytes = chunk_bytes
        self.remote_workers = remote_workers
        #: Trust no ledger: every object is hashed again before it is reused or vouched for.
        self.rehash = rehash
        #: Hard-link a local source's read-only files into the cache instead of copying them.
        self.link = link
        self._clients: dict[tuple, fsspec.AbstractFileSystem] = {}
        self._clients_lock = threading.Lock()
        self.objects_dir = self.cache_dir / "objects"
        self.ledger_dir = self.cache_dir / "ledger"
        self.bundles_dir = self.cache_dir / "bundles"
        self.locks_dir = self.cache_dir / "locks"
        self.incoming_dir = self.cache_dir / "incoming"
        self.receipts_dir = self.cache_dir / "receipts"
        for d in (
            self.objects_dir,
            self.ledger_dir,
            self.bundles_dir,
            self.locks_dir,
            self.incoming_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)
        self._device = os.stat(self.incoming_dir).st_dev

    def _version_lock(self, version: str) -> filelock.BaseFileLock:
        """The lock serialising the download and materialisation of one version.

        It waits as long as its holder works (a large download); a holder that dies releases it.
        """
        return filelock.FileLock(self.locks_dir / f"{version}.lock", timeout=-1)

    def _object_lock(self, sha256: str) -> filelock.BaseFileLock:
        """The lock held while an object's partial file is written (one writer per partial).

        Striped by the digest's first three hex digits: at most 4096 lock files, however many
        objects the cache holds; two objects sharing a stripe only wait for each other.
        """
        d = self.locks_dir / "objects"
        d.mkdir(exist_ok=True)
        return filelock.FileLock(d / f"{sha256[:3]}.lock", timeout=-1)

    # -- locations ---------------------------------------------------------------------------

    def open_location(
        self, url: str, credential_ref: str | None
    ) -> tuple[fsspec.AbstractFileSystem, str]:
        """The fsspec filesystem and path for ``url``, with ``credential_ref``'s secret if any."""
        options: dict = {}
        if credential_ref is not None:
            if self.credentials is None:
                raise UnknownCredential(
                    f"credential_ref {credential_ref!r} given but this bundle store has no "
                    "credential registry"
                )
            options = self.credentials.storage_options_for(credential_ref, url)
            # fsspec's process-wide instance cache would keep the secret alive for good; this
            # store's own cache keeps it as long as the store (a step, a sensor tick) lives.
            options["skip_instance_cache"] = True
        if "::" in url:  # a chained URL: fsspec composes its layers
            fs, root = fsspec.core.url_to_fs(url, **options)
            return fs, root.rstrip("/") or root
        # One client per protocol and secret for this store's lifetime: an S3 client costs a
        # session and a connection pool, and a sensor tick opens many URLs of one bucket. A
        # rotated secret is another key, so it gets a client of its own.
        key = (get_protocol(url), tuple(sorted(options.items())))
        with self._clients_lock:
            fs = self._clients.get(key)
            if fs is None:
                fs, root = fsspec.core.url_to_fs(url, **options)
                self._clients[key] = fs
            else:
                root = fs._strip_protocol(url)
        return fs, root.rstrip("/") or root

    def read_manifest(self, url: str, credential_ref: str | None = None) -> Manifest:
        """Read and validate only ``result-manifest.json`` at ``url``."""
        fs, root = self.open_location(url, credential_ref)
        return parse_manifest(
            self._manifest_bytes(fs, root, url), path=_join(url, fmt.MANIFEST_NAME)
        )

    def source(self, url: str, credential_ref: str | None = None) -> SourceBundle:
        """The bundle at ``url`` as a :class:`SourceBundle` (its manifest read and validated)."""
        return SourceBundle(
            url=url,
            credential_ref=credential_ref,
            manifest=self.read_manifest(url, credential_ref),
        )

    @staticmethod
    def _manifest_bytes(fs: fsspec.AbstractFileSystem, root: str, url: str) -> bytes:
        """The manifest's text: a local one opened as ``verify`` opens it (no symlink, no FIFO,
        its size bounded before it is read), a remote one read no further than the limit."""
        try:
            if _is_local(fs):
                return read_manifest_bytes(root)
            return fs.cat_file(
                posixpath.join(root, fmt.MANIFEST_NAME), start=0, end=fmt.MAX_MANIFEST_BYTES + 1
            )
        except (FileNotFoundError, IsADirectoryError, IncompleteBundle):
            raise IncompleteBundle(
                f"{_join(url, fmt.MANIFEST_NAME)}: no manifest; the bundle is not complete, "
                "so none of its files is read",
                path=url,
            ) from None

    # -- fetch -------------------------------------------------------------------------------

    def fetch(self, url: str, *, credential_ref: str | None = None) -> FetchResult:
        """Download the bundle at ``url`` into the cache once and return its local view.

        The manifest is read first and last; a bundle whose manifest changed in between is
        refused with :class:`ManifestChanged` (the files that arrived intact stay as objects,
        but no view is made). Files download in parallel, a partial file an interrupted fetch
        left is continued, and a file whose bytes do not match the manifest is refused by name.
        """
        fs, root = self.open_location(url, credential_ref)
        raw = self._manifest_bytes(fs, root, url)
        manifest = parse_manifest(raw, path=_join(url, fmt.MANIFEST_NAME))
        version = manifest.snapshot.version_id
        try:  # the manifest model applies this rule already; the cache never relies on that
            fmt.check_version_id(version)
        except ValueError as e:
            where = _join(url, fmt.MANIFEST_NAME)
            raise UnsafePath(f"{where}: {e}", path=fmt.MANIFEST_NAME) from None
        if _is_local(fs):  # what verify refuses by path or file type is never copied
            unsafe = unsafe_paths(Path(root), manifest)
            if unsafe:
                raise unsafe[0]
        held = self._held(manifest)
        if held is not None:  # nothing to write: no lock either, so a read-only cache serves it
            return FetchResult(held, manifest, 0, 0, len(manifest.bound_files), 0, 0)
        reused = hashed = 0
        # One fetcher per version at a time: the others wait, then find every object present
        # and the view current (nothing downloaded or hashed twice, no view rebuilt under them).
        with self._version_lock(version):
            sweep(self.incoming_dir, "link")  # links a killed fetch made and never renamed
            todo: dict[str, FileEntry] = {}  # by digest: two entries of equal bytes, one download
            for entry in manifest.bound_files:
                if entry.sha256 in todo:
                    continue
                if self._have(entry):
                    reused += 1
                    continue
                if self.object_path(entry.sha256).exists():  # present but unrecorded: check it
                    hashed += entry.bytes
                    if self._adopt(entry):
                        reused += 1
                        continue
                todo[entry.sha256] = entry
            # Local copies: one file per core, so each copy's fsync and each file's sha256
            # overlap with the others' (measured in bench/chain.py). Remote transfers wait on
            # the network, so more of them are in flight (bench/s3.py).
            local = _is_local(fs)
            limit = cpu_count() if local else self.remote_workers
            workers = max(1, min(limit, len(todo)))
            failed = threading.Event()

            def download(entry: FileEntry) -> tuple[int, int, bool]:
                if failed.is_set():  # a file already failed: start no new download
                    return 0, 0, False
                try:
                    return self._download(fs, posixpath.join(root, entry.path), entry, url)
                except BaseException:
                    failed.set()
                    raise

            with ThreadPoolExecutor(workers, thread_name_prefix="fetch") as pool:
                futures = [pool.submit(download, e) for e in todo.values()]
            counts = [f.result() for f in futures]  # the first failure in manifest order
            nbytes = sum(sent for sent, _, _ in counts)
            resumed = sum(kept for _, kept, _ in counts)
            linked = sum(1 for _, _, was_linked in counts if was_linked)
            hashed += sum(e.bytes for e in todo.values())
            last = self._manifest_bytes(fs, root, url)
            if last != raw:
                raise ManifestChanged(
                    f"{_join(url, fmt.MANIFEST_NAME)} changed while the bundle was downloaded "
                    f"(sha256 {sha256_bytes(raw)} when read first, {sha256_bytes(last)} when "
                    f"read last); version {version} is not viewed: fetch again once the store "
                    "holds one finished bundle",
                    path=fmt.MANIFEST_NAME,
                )
            view = self._materialize(manifest, raw)
        return FetchResult(view, manifest, nbytes, len(todo), reused, hashed, resumed, linked)

    def object_path(self, sha256: str) -> Path:
        """Where the cache keeps the file whose content has this sha256."""
        return self.objects_dir / sha256

    def _ledger_path(self, sha256: str) -> Path:
        return self.ledger_dir / f"{sha256}.json"

    def _ledger_matches(self, sha256: str) -> bool:
        """Whether the object is still the file that was hashed when it entered the cache."""
        if self.rehash:
            return False
        return matches(self.object_path(sha256), self._recorded(sha256))

    def _recorded(self, sha256: str) -> Fingerprint | None:
        """The fingerprint the ledger recorded for the object, if it holds a readable one."""
        try:
            return Fingerprint.from_dict(json.loads(self._ledger_path(sha256).read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def _have(self, entry: FileEntry) -> bool:
        try:
            st = os.stat(self.object_path(entry.sha256))
        except FileNotFoundError:
            return False
        return (
            st.st_size == entry.bytes
            and is_read_only(st.st_mode)
            and self._ledger_matches(entry.sha256)
        )

    def _adopt(self, entry: FileEntry) -> bool:
        """Re-check an object with no valid ledger entry; keep it if its bytes are right.

        Another version's fetch may be adopting or replacing the same object at the same time
        (objects are shared between versions): an object gone meanwhile is simply not adopted.
        """
        obj = self.object_path(entry.sha256)
        try:
            # A writable object is not made read-only here: it may be a link to a user's file
            # (see _link), whose mode is theirs. It is replaced instead.
            st = obj.stat()
            if (
                st.st_size == entry.bytes
                and is_read_only(st.st_mode)
                and sha256_file(obj) == entry.sha256
            ):
                self._record(entry.sha256, obj)
                return True
        except FileNotFoundError:
            return False
        _remove(obj)
        return False

    def _record(self, sha256: str, obj: Path) -> None:
        fp = Fingerprint.of(obj).as_dict()
        atomic_write_text(self._ledger_path(sha256), json.dumps(fp) + "\n")

    def _relinked(self, manifest: Manifest) -> None:
        """Record again the objects this cache just linked or unlinked (a view made or removed).

        A link count change moves an object's ctime, which the ledger keeps to notice edits; an
        object whose fingerprint differs from its ledger in the ctime alone is the one the ledger
        vouched for, and is recorded again. Any other difference stays untrusted.
        """
        for entry in manifest.bound_files:
            obj = self.object_path(entry.sha256)
            try:
                recorded = self._recorded(entry.sha256)
                if recorded is not None and recorded.differs_only_in_ctime(Fingerprint.of(obj)):
                    self._record(entry.sha256, obj)
            except OSError:
                continue  # no object, or an unreadable ledger: nothing to carry over

    def _download(
        self, fs: fsspec.AbstractFileSystem, remote: str, entry: FileEntry, url: str
    ) -> tuple[int, int, bool]:
        """Bring one bound file into ``objects/``: ``(bytes transferred, bytes resumed, linked)``.

        A local file the cache may link (:meth:`_link`) is linked; any other is copied.

        The partial file ``incoming/<sha256>`` survives an interruption (a killed process, a
        dropped connection) and is continued by the next fetch from its length: its prefix is
        hashed from the disk, the rest as it is written, so a complete file is never read back.
        A resumed file that does not match is fetched once more from the start (its prefix may
        be what was stale); a fresh one that does not match is refused. Only a file that
        matches is flushed, made read-only, renamed into ``objects/`` and recorded.
        """
        where = _join(url, entry.path)
        with self._object_lock(entry.sha256):
            if self._have(entry):  # another fetch (another version) brought it meanwhile
                return 0, 0, False
            if self.link and _is_local(fs) and self._link(Path(remote), entry, where):
                return 0, 0, True
            partial = self.incoming_dir / entry.sha256
            sent = 0
            while True:
                kept = _length(partial)
                if kept > entry.bytes:  # cannot be a prefix of this file
                    _remove(partial)
                    kept = 0
                # Hashed as written, each piece while it is still in the CPU's cache, so no
                # complete file is read back: only a kept prefix is, from the disk, first.
                h = Sha256Stream()
                if kept:
                    h.update_file(partial)
                if kept < entry.bytes or kept == 0:  # else it arrived whole, died before rename
                    sent += self._transfer(fs, remote, partial, kept, entry, where, h)
                digest = h.hexdigest()
                if digest == entry.sha256:
                    break
                _remove(partial)  # the next round starts from nothing: it cannot loop twice
                if kept == 0:
                    raise DigestMismatch(
                        f"{where}: sha256 expected {entry.sha256} (manifest), downloaded "
                        f"{digest}; nothing was kept",
                        path=entry.path,
                    )
            fsync_file(partial)  # durable before the cache trusts it
            os.chmod(partial, READ_ONLY)
            self._install(partial, entry)
            return sent, kept, False

    def _link(self, source: Path, entry: FileEntry, where: str) -> bool:
        """Make a local bound file an object by a hard link: none of its bytes is written.

        Only a regular file that nobody may write, on the cache's file system, is linked: a
        bundle's producer made it read-only (as ``stage`` does), so changing it in place takes a
        ``chmod`` first, which moves its ctime, and the ledger then no longer vouches for it: a
        bundle whose source was edited after it was cached is hashed again and refused, never
        read. A writable file, one on another file system or one the kernel will not link
        (``fs.protected_hardlinks``) is copied instead (returns False), as is one whose
        fingerprint moved while it was hashed. The cache never changes a linked file's mode.
        """
        try:
            st = os.lstat(source)
        except OSError:
            return False
        if not (
            stat.S_ISREG(st.st_mode)
            and is_read_only(st.st_mode)
            and st.st_dev == self._device
            and st.st_size == entry.bytes
        ):
            return False
        tmp = self.incoming_dir / owned_name(entry.sha256, "link")
        try:
            os.link(source, tmp, follow_symlinks=False)
        except OSError:  # another file system after all, the link limit, a kernel's refusal
            return False
        try:
            before = Fingerprint.of(tmp)
            if before.ino != st.st_ino or not is_read_only(os.lstat(tmp).st_mode):
                return False  # replaced since it was looked at
            digest = sha256_file(tmp)
            if Fingerprint.of(tmp) != before:
                return False  # written while it was hashed: a copy is hashed as it is made
            if digest != entry.sha256:
                raise DigestMismatch(
                    f"{where}: sha256 expected {entry.sha256} (manifest), found {digest}; "
                    "nothing was kept",
                    path=entry.path,
                )
            fsync_file(tmp)  # the producer's bytes on the disk before the cache vouches for them
            self._install(tmp, entry)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()  # never chmod: it is the user's file

    def _install(self, path: Path, entry: FileEntry) -> None:
        """Rename ``path`` (its bytes checked against ``entry``, read-only, flushed) into
        ``objects/`` and record it in the ledger. Where the same bytes became an object
        meanwhile (another fetch, a publish), ``path`` is dropped and that object is kept,
        re-checked first unless the ledger vouches for it."""
        obj = self.object_path(entry.sha256)
        try:
            rename_noreplace(path, obj)
        except FileExistsError:
            _remove(path)
            if not self._have(entry):
                self._adopt(entry)
            return
        fsync_dir(self.objects_dir)
        self._record(entry.sha256, obj)

    def _transfer(
        self,
        fs: fsspec.AbstractFileSystem,
        remote: str,
        partial: Path,
        start: int,
        entry: FileEntry,
        where: str,
        h: Sha256Stream,
    ) -> int:
        """Append the remote file's bytes from ``start`` to ``partial``, feeding each chunk to
        ``h`` as it is written; return bytes sent."""
        pos = start
        # A resumed read starts past the first byte: ask the size first, so that an object
        # shorter than what arrived is refused here rather than as a range the store rejects.
        if start and (size := fs.size(remote)) != entry.bytes:
            raise _size_refused(partial, where, entry, size)
        with _open_remote(fs, remote, start, self.chunk_bytes, entry.path) as src:
            if src.size != entry.bytes:
                raise _size_refused(partial, where, entry, src.size)
            # Unbuffered: every chunk written is in the file before the next one is read, so a
            # process killed at any point leaves a partial file as long as what arrived.
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                while pos < entry.bytes:
                    pieces = src.read(min(self.chunk_bytes, entry.bytes - pos))
                    if not pieces:
                        break
                    written = pos
                    for piece in pieces:  # hashed just after it is written: still in cache
                        pos += _write_all(fd, piece)
                        h.update(piece)
                    start_writeback(fd, written, pos - written)  # the final fsync waits less
            finally:
                os.close(fd)
        if pos != entry.bytes:
            _remove(partial)
            raise SizeMismatch(
                f"{where}: expected {entry.bytes} bytes, the download ended at {pos}; "
                "nothing was kept",
                path=entry.path,
            )
        return pos - start

    def _materialize(self, manifest: Manifest, raw: bytes) -> Path:
        """Return the current view of this version, building it if needed.

        Call with :meth:`_version_lock` held: only then is "the view is missing or stale" still
        true when the view is replaced, so no process retires a view another one just published.
        """
        version = manifest.snapshot.version_id
        view = self.bundles_dir / version
        if view.exists() and self._view_is_current(view, manifest):
            return view
        tmp = self.bundles_dir / f".{version}.view-{secrets.token_hex(6)}"
        try:
            (tmp / fmt.PARTS_DIR).mkdir(parents=True)
            for entry in manifest.bound_files:
                os.link(self.object_path(entry.sha256), tmp / entry.path)
            atomic_write_bytes(tmp / fmt.MANIFEST_NAME, raw, replace=False)
            os.chmod(tmp / fmt.MANIFEST_NAME, READ_ONLY)
            fsync_dir(tmp / fmt.PARTS_DIR)
            if os.path.lexists(view):  # links objects since replaced (tampered): retire it
                self._remove_view(view)
            rename_noreplace(tmp, view)  # under the version lock nobody else publishes it
            fsync_dir(self.bundles_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._relinked(manifest)
        return view

    def _held(self, manifest: Manifest) -> Path | None:
        """The view of ``manifest``'s version if the cache holds it whole: current, every object
        present and vouched for by its ledger (nothing to download, hash or write)."""
        view = self.bundles_dir / manifest.snapshot.version_id
        try:
            current = view.is_dir() and self._view_is_current(view, manifest)
        except DigestMismatch:
            return None  # another bundle under this version id: the locked path says so
        if current and all(self._have(e) for e in manifest.bound_files):
            return view
        return None

    def _view_is_current(self, view: Path, manifest: Manifest) -> bool:
        """Whether an existing view is this version, linked to the current objects.

        A view of the same version_id with another ``content_sha256`` is refused loudly; a view
        whose links point at objects that were since replaced is reported stale (rebuilt).
        """
        try:
            existing = parse_manifest((view / fmt.MANIFEST_NAME).read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return False
        if existing.snapshot != manifest.snapshot:
            raise DigestMismatch(
                f"{view}: a cached view of version {manifest.snapshot.version_id} exists with "
                f"content_sha256 {existing.snapshot.content_sha256}, expected "
                f"{manifest.snapshot.content_sha256}",
                path=str(view),
            )
        for entry in manifest.bound_files:
            try:
                a = os.stat(view / entry.path)
                b = os.stat(self.object_path(entry.sha256))
            except FileNotFoundError:
                return False
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                return False
        return True

    # -- trust -------------------------------------------------------------------------------

    def trusted(self, path: str | os.PathLike[str], entry: FileEntry) -> bool:
        """Whether ``path`` is provably the verified cache object for ``entry`` (skip hashing).

        True only when ``path`` is the same inode as ``objects/<entry.sha256>``, that object is
        read-only and the right size, and the ledger written when it was hashed on arrival still
        describes it (device, inode, size, mtime and ctime). A copy, a rewritten or a writable file,
        or any file when the store was made with ``rehash``, is hashed.
        """
        try:
            st = os.stat(path)
            ost = os.stat(self.object_path(entry.sha256))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return (
            (st.st_dev, st.st_ino) == (ost.st_dev, ost.st_ino)
            and stat.S_ISREG(ost.st_mode)
            and is_read_only(ost.st_mode)
            and ost.st_size == entry.bytes
            and self._ledger_matches(entry.sha256)
        )

    def verify(self, path: str | os.PathLike[str]) -> VerifiedSnapshot:
        """Verify a bundle (a view of this cache, or any directory): in full once, hashing only
        what the cache cannot vouch for (see :meth:`trusted`), then by its receipt while every
        file keeps its fingerprint (:mod:`pipeline.bundle.receipt`; never with ``rehash``)."""
        return self.check(path).verified()

    def check(self, path: str | os.PathLike[str]) -> CheckResult:
        """:meth:`verify` listing every violation (:func:`~pipeline.bundle.verify.check`)."""
        if self.rehash:
            return check(path, trusted=self.trusted)
        return check_once(path, self.receipt_path(path), trusted=self.trusted)

    def receipt_path(self, path: str | os.PathLike[str]) -> Path:
        """Where the receipt of the bundle at ``path`` is kept (one per directory)."""
        key = sha256_bytes(str(Path(path).resolve()).encode())[:32]
        return self.receipts_dir / f"{key}.json"

    # -- publish -----------------------------------------------------------------------------

    def staging_dir(self) -> Path:
        """Where to :func:`~pipeline.bundle.stage.stage` a bundle that :meth:`publish` adopts
        (inside the cache, so adopting it is a rename, not a copy)."""
        d = self.cache_dir / "staging"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def staging_path(self, version: str) -> Path:
        """A fresh place under :meth:`staging_dir` to stage ``version`` for :meth:`publish`,
        named after this process; what exited processes staged there and never published
        (killed between staging and publishing, or while publishing) is removed first."""
        d = self.staging_dir()
        sweep(d, "staged")
        return d / owned_name(version, "staged")

    def publish(self, staged: VerifiedSnapshot) -> VerifiedSnapshot:
        """Adopt a bundle just staged under :meth:`staging_dir` as cache objects; return its view.

        ``staged`` was verified by ``stage`` (its digests computed from the written files), so
        its files become read-only objects recorded in the ledger without being hashed again,
        exactly as a download is after its digest check. The staged directory is removed; the
        bundle lives on as ``bundles/<version_id>/``, verifiable with :meth:`trusted`.
        """
        root = Path(staged.root)
        if root.parent != self.staging_dir().resolve():
            raise ValueError(f"{root}: publish adopts bundles staged under {self.staging_dir()}")
        manifest = staged.manifest
        raw = (root / fmt.MANIFEST_NAME).read_bytes()
        with self._version_lock(manifest.snapshot.version_id):
            view = self._adopt_staged(root, manifest, raw)
            shutil.rmtree(root, ignore_errors=True)  # may unlink links to objects: see _relinked
            self._relinked(manifest)
        return self.verify(view)

    def retire(self, version: str) -> bool:
        """Remove the view of ``version``, if any (its objects stay: other views may share them).

        For a bundle published and then never recorded (its step killed in between): no view
        may outlive what refers to it. Returns whether there was a view to remove.
        """
        fmt.check_version_id(version)
        view = self.bundles_dir / version
        with self._version_lock(version):
            try:
                manifest = parse_manifest((view / fmt.MANIFEST_NAME).read_bytes())
            except (FileNotFoundError, NotADirectoryError):
                return False
            self._remove_view(view)
            fsync_dir(self.bundles_dir)
            self._relinked(manifest)  # the view's links are gone: its objects' ctimes moved
        return True

    def _remove_view(self, view: Path) -> None:
        """Take ``view`` out of ``bundles/`` in one rename, then delete it (version lock held)."""
        stale = self.bundles_dir / f".{view.name}.stale-{secrets.token_hex(6)}"
        os.rename(view, stale)
        shutil.rmtree(stale, ignore_errors=True)

    def _adopt_staged(self, root: Path, manifest: Manifest, raw: bytes) -> Path:
        """Move a staged bundle's files into the objects and materialise its view (locked)."""
        for entry in manifest.bound_files:
            obj = self.object_path(entry.sha256)
            if self._have(entry) or (obj.exists() and self._adopt(entry)):
                continue  # the same bytes are already an object (an earlier identical output)
            src = root / entry.path
            os.chmod(src, READ_ONLY)
            self._install(src, entry)
        return self._materialize(manifest, raw)

    # -- upload ------------------------------------------------------------------------------

    def upload(
        self, bundle: VerifiedSnapshot, url: str, *, credential_ref: str | None = None
    ) -> UploadResult:
        """Publish a verified bundle to ``url`` (an ``s3://`` prefix, any fsspec location).

        Every bound file is written first, each only where no object of that name exists; the
        manifest last, the same way, so a reader of ``url`` sees no bundle until every part it
        binds is there, and a crash mid-upload leaves no manifest. A manifest already at
        ``url`` that is this bundle's makes the upload a no-op; any other is refused with
        :class:`~pipeline.bundle.errors.BundleExists` before anything is written. A part left
        by a crashed upload of this bundle (same bytes) is kept; a different one is refused.
        Exclusive writes rely on the store honouring ``If-None-Match`` (AWS S3 does, moto too).
        """
        local = Path(bundle.root)
        raw = (local / fmt.MANIFEST_NAME).read_bytes()
        manifest = parse_manifest(raw, path=str(local / fmt.MANIFEST_NAME))
        if manifest.snapshot != bundle.manifest.snapshot:
            raise DigestMismatch(
                f"{local}: the manifest on disk is {manifest.snapshot}, the verified bundle "
                f"{bundle.manifest.snapshot}; nothing was uploaded",
                path=fmt.MANIFEST_NAME,
            )
        files = [_Bound(e.path, local / e.path, e.sha256, e.bytes) for e in manifest.bound_files]
        marker = _Bound(fmt.MANIFEST_NAME, local / fmt.MANIFEST_NAME, "", len(raw))

        def refuse_other(existing: bytes) -> UploadResult:
            return self._published_already(existing, raw, url, manifest)

        return self._publish(url, credential_ref, files, marker, refuse_other)

    def upload_files(
        self,
        files: Mapping[str, Path],
        url: str,
        *,
        last: str,
        digests: Mapping[str, str] | None = None,
        credential_ref: str | None = None,
    ) -> UploadResult:
        """Publish local files under ``url`` by relative name, the file named ``last`` after all
        the others, with :meth:`upload`'s rules: nothing is written over anything; ``last``
        already there with the same bytes makes it a no-op, with other bytes refuses it.

        ``digests`` are the files' sha256 where known (a checkpoint's, from its record); the
        others are hashed now. They decide whether a file a crashed upload left is kept.
        """
        digests = dict(digests or {})
        bound = [
            _Bound(name, Path(p), digests.get(name) or sha256_file(p), os.stat(p).st_size)
            for name, p in files.items()
            if name != last
        ]
        marker_path = Path(files[last])
        raw = marker_path.read_bytes()
        marker = _Bound(last, marker_path, "", len(raw))

        def refuse_other(existing: bytes) -> UploadResult:
            if existing == raw:
                return UploadResult(url, 0, 0, len(bound), already_published=True)
            raise BundleExists(
                f"{_join(url, last)}: holds other bytes than {marker_path}; what is published "
                "is never overwritten",
                path=last,
            )

        return self._publish(url, credential_ref, bound, marker, refuse_other)

    def _publish(
        self,
        url: str,
        credential_ref: str | None,
        files: list[_Bound],
        marker: _Bound,
        refuse_other: Callable[[bytes], UploadResult],
    ) -> UploadResult:
        """Every file, then the marker, each create-only (see :meth:`upload`)."""
        fs, root = self.open_location(url, credential_ref)
        remote_marker = posixpath.join(root, marker.path)
        if (existing := _read_or_none(fs, remote_marker)) is not None:
            return refuse_other(existing)
        limit = cpu_count() if _is_local(fs) else self.remote_workers
        workers = max(1, min(limit, len(files)))
        with ThreadPoolExecutor(workers, thread_name_prefix="upload") as pool:
            futures = [pool.submit(self._put_part, fs, root, f, url) for f in files]
        written = [f.result() for f in futures]
        try:
            _put_new(fs, marker.local, remote_marker)
        except FileExistsError:  # another upload finished first: the same files, or refused
            return refuse_other(fs.cat_file(remote_marker))
        return UploadResult(
            url=url,
            files_uploaded=sum(written),
            bytes_uploaded=sum(f.bytes for f, w in zip(files, written, strict=True) if w),
            files_present=len(written) - sum(written),
            already_published=False,
        )

    @staticmethod
    def _published_already(
        existing: bytes, raw: bytes, url: str, manifest: Manifest
    ) -> UploadResult:
        if existing == raw:
            return UploadResult(url, 0, 0, len(manifest.bound_files), already_published=True)
        try:
            there = parse_manifest(existing).snapshot
            what = f"version {there.version_id} ({there.content_sha256})"
        except BundleError:
            what = "a manifest that is not this bundle's"
        raise BundleExists(
            f"{_join(url, fmt.MANIFEST_NAME)}: holds {what}, not {manifest.snapshot.version_id} "
            f"({manifest.snapshot.content_sha256}); a published bundle is never overwritten",
            path=url,
        )

    def _put_part(self, fs: fsspec.AbstractFileSystem, root: str, f: _Bound, url: str) -> bool:
        """Write one file where nothing is; True if written, False if already there."""
        remote = posixpath.join(root, f.path)
        try:
            _put_new(fs, f.local, remote)
            return True
        except FileExistsError:
            pass
        # An S3 PUT is all or nothing, so what a crashed upload left is whole: keep it if it is
        # this file's bytes (a retry then sends only the rest).
        if fs.size(remote) == f.bytes:
            with fs.open(remote, "rb", block_size=self.chunk_bytes, cache_type="none") as src:
                chunks = iter(lambda: src.read(self.chunk_bytes), b"")
                if sha256_buffers(chunks) == f.sha256:
                    return False
        raise BundleExists(
            f"{_join(url, f.path)}: a file other than the one to publish (sha256 {f.sha256}) "
            "is already there and is never overwritten; nothing was uploaded over it",
            path=f.path,
        )


@dataclass(frozen=True)
class _Bound:
    """A local file to publish: its name under the prefix, where it is, its sha256 and size."""

    path: str
    local: Path
    sha256: str
    bytes: int


class _RemoteFile:
    """A remote file read from an offset: its whole size, and ``read(n)``: up to ``n`` bytes as
    the pieces they arrived in (each written and hashed as it is, never joined into a copy)."""

    size: int

    def read(self, n: int) -> list[bytes | memoryview]:
        raise NotImplementedError


class _S3Stream(_RemoteFile):
    """One streamed GET of an S3 object from ``start`` on: one request per file, however many
    chunks, each read as it arrives (s3fs's files would make a ranged GET per read, and stores
    that copy the whole object for each range, moto among them, would pay it per chunk)."""

    def __init__(self, fs, path: str, start: int) -> None:
        self._loop = fs.loop
        bucket, key, version = fs.split_path(path)
        extra = {"VersionId": version} if version else {}
        if start:
            extra["Range"] = f"bytes={start}-"
        response = sync(self._loop, fs._call_s3, "get_object", Bucket=bucket, Key=key, **extra)
        self._body = response["Body"]
        self._next_piece = _piece_reader(self._body)
        self._rest = memoryview(b"")  # what the last piece held past the last read's end
        if start:  # "bytes 100-199/200": the object's size is after the slash
            self.size = int(response["ContentRange"].rpartition("/")[2])
        else:
            self.size = int(response["ContentLength"])

    def read(self, n: int) -> list[bytes | memoryview]:
        return sync(self._loop, self._read_up_to, n)

    async def _read_up_to(self, n: int) -> list[bytes | memoryview]:
        """Up to ``n`` bytes, fewer only at the body's end (one hop to the event loop per
        chunk, not per network read); a piece that runs past ``n`` is cut, not copied."""
        pieces: list[bytes | memoryview] = []
        got = 0
        while got < n:
            piece = self._rest or memoryview(await self._next_piece())
            if not piece:
                break
            piece, self._rest = piece[: n - got], piece[n - got :]
            pieces.append(piece)
            got += len(piece)
        return pieces

    def close(self) -> None:
        self._body.close()


def _piece_reader(body) -> Callable[[], Awaitable[bytes]]:
    """The next piece of a response body as the network delivered it, or ``b""`` at its end.

    On aiohttp (s3fs's client) each piece is taken whole from the response's buffer: ``read(n)``
    would join what is buffered into a new copy on the event loop every transfer shares, and
    botocore's body would also CRC32 every byte there, a checksum it checks only at a read
    past the end, which the fetch never makes (it reads exactly the manifest's size): every byte
    is sha256-checked against the manifest instead.
    """
    content = getattr(getattr(body, "raw_stream", None), "content", None)
    if content is None or not hasattr(content, "readchunk"):  # another HTTP client
        return lambda: body.read(DEFAULT_CHUNK_BYTES)

    async def next_piece() -> bytes:
        while True:
            data, _ = await content.readchunk()
            if data or content.at_eof():  # (an empty piece ends an HTTP chunk, not the body)
                return data

    return next_piece


class _FsspecFile(_RemoteFile):
    """Any other fsspec file, read from ``start`` in ``block``-sized reads with no read-ahead."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, start: int, block: int):
        self._f = fs.open(path, "rb", block_size=block, cache_type="none")
        size = getattr(self._f, "size", None)
        self.size = fs.size(path) if size is None else size
        if start:
            self._f.seek(start)

    def read(self, n: int) -> list[bytes | memoryview]:
        data = self._f.read(n)
        return [data] if data else []

    def close(self) -> None:
        self._f.close()


class _LocalFile(_FsspecFile):
    """A local file opened as ``verify`` opens one: no symlink followed, no blocking on a FIFO,
    a regular file or refused (:class:`~pipeline.bundle.errors.UnsafePath`); read as any other."""

    def __init__(self, path: str, start: int, rel: str):  # opened here, not through fsspec
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath(
                    f"{path}: is a symlink; bound files must be regular files inside the bundle",
                    path=rel,
                ) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise UnsafePath(
                f"{path}: is not a regular file; bound files must be regular files inside the "
                "bundle",
                path=rel,
            )
        self._f = os.fdopen(fd, "rb", buffering=0)
        self.size = st.st_size
        if start:
            self._f.seek(start)


@contextlib.contextmanager
def _open_remote(
    fs: fsspec.AbstractFileSystem, path: str, start: int, block: int, rel: str = ""
) -> Iterator[_RemoteFile]:
    """Open ``path`` for reading from byte ``start`` (a streamed GET on S3, a safe open of a
    local file, else fsspec); ``rel`` names it in the bundle."""
    s3 = hasattr(fs, "_call_s3") and hasattr(fs, "split_path")  # s3fs, without importing it
    f: _RemoteFile
    if s3:
        f = _S3Stream(fs, path, start)
    elif _is_local(fs):
        f = _LocalFile(path, start, rel)
    else:
        f = _FsspecFile(fs, path, start, block)
    try:
        yield f
    finally:
        f.close()


def _size_refused(partial: Path, where: str, entry: FileEntry, size: int) -> SizeMismatch:
    """Drop the partial file of a remote file of the wrong size; the error to raise."""
    _remove(partial)
    return SizeMismatch(
        f"{where}: expected {entry.bytes} bytes (manifest), the store holds {size}; nothing "
        "was kept",
        path=entry.path,
    )


def _read_or_none(fs: fsspec.AbstractFileSystem, path: str) -> bytes | None:
    try:
        return fs.cat_file(path)
    except (FileNotFoundError, IsADirectoryError):
        return None


def _put_new(fs: fsspec.AbstractFileSystem, local: Path, remote: str) -> None:
    """Copy ``local`` to ``remote`` only if nothing is there (``FileExistsError`` otherwise).

    On a local file system through a temporary sibling and a rename that never replaces (a
    reader sees the whole file or none); elsewhere as one conditional write.
    """
    if not _is_local(fs):
        fs.put_file(str(local), remote, mode="create")
        return
    dest = Path(remote)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}.tmp")
    try:
        shutil.copyfile(local, tmp)
        fsync_file(tmp)
        rename_noreplace(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(dest.parent)


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _length(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _write_all(fd: int, data: bytes | memoryview) -> int:
    """Write all of ``data``, at most ``_WRITE_BYTES`` per system call."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:_WRITE_BYTES]) :]
    return len(data)


def _remove(path: Path) -> None:
    """Unlink ``path``, read-only or not, without changing its mode (an object may be a link to
    a user's file: see ``BundleStore._link``)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _join(url: str, rel: str) -> str:
    return f"{url.rstrip('/')}/{rel}"
