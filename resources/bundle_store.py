"""The bundle store: fetch a bundle from any fsspec location into a content-addressed local cache.

A bundle is downloaded once. Its manifest is read first (no manifest, nothing else is read);
every bound file lands in ``objects/<sha256>`` after its digest and size are checked, read-only,
and a ledger entry records that it was hashed on arrival. A bundle is then materialised as a view
``bundles/<version_id>/`` of hard links to those objects, so a newer version that binds parts an
older one already had costs only its new parts in download and in hashing: :meth:`trusted` lets
``pipeline.bundle.verify.verify`` skip files that are provably the verified objects.

Any number of processes may fetch into one cache at once. Objects are content-addressed and
arrive by an atomic rename that never replaces, so racing downloads of one file are harmless.
A view is built and published under a lock per version (``locks/<version_id>.lock``, an OS file
lock the kernel releases if its holder dies): the first fetcher materialises it, the others find
it current and return it, and a published view is only ever retired when it is stale (it links
an object that was found tampered with and replaced), never because another process is busy.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import shutil
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import filelock
import fsspec
from pydantic import BaseModel, ConfigDict

from pipeline.bundle import format as fmt
from pipeline.bundle.atomic import (
    atomic_write_bytes,
    atomic_write_text,
    fsync_dir,
    rename_noreplace,
)
from pipeline.bundle.digest import cpu_count, sha256_file
from pipeline.bundle.errors import DigestMismatch, IncompleteBundle, SizeMismatch, UnsafePath
from pipeline.bundle.fingerprint import Fingerprint, matches
from pipeline.bundle.manifest import FileEntry, Manifest, parse_manifest
from pipeline.bundle.verify import VerifiedSnapshot, verify
from resources.credentials import CredentialRegistry, UnknownCredential

_COPY_CHUNK = 4 * 1024 * 1024


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
    bytes_downloaded: int
    files_downloaded: int
    files_reused: int
    bytes_hashed: int  # hashed on arrival (downloads, plus any cache object re-checked)


class BundleStore:
    """A content-addressed cache of bundles fetched from URLs or plain paths through fsspec."""

    def __init__(
        self, cache_dir: str | os.PathLike[str], credentials: CredentialRegistry | None = None
    ):
        self.cache_dir = Path(cache_dir).resolve()
        self.credentials = credentials
        self.objects_dir = self.cache_dir / "objects"
        self.ledger_dir = self.cache_dir / "ledger"
        self.bundles_dir = self.cache_dir / "bundles"
        self.locks_dir = self.cache_dir / "locks"
        for d in (self.objects_dir, self.ledger_dir, self.bundles_dir, self.locks_dir):
            d.mkdir(parents=True, exist_ok=True)

    def _version_lock(self, version: str) -> filelock.BaseFileLock:
        """The lock serialising the download and materialisation of one version.

        It waits as long as its holder works (a large download); a holder that dies releases it.
        """
        return filelock.FileLock(self.locks_dir / f"{version}.lock", timeout=-1)

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
            # a cached filesystem instance would keep the secret alive beyond this download
            options["skip_instance_cache"] = True
        fs, root = fsspec.core.url_to_fs(url, **options)
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
        try:
            return fs.cat_file(posixpath.join(root, fmt.MANIFEST_NAME))
        except (FileNotFoundError, IsADirectoryError):
            raise IncompleteBundle(
                f"{_join(url, fmt.MANIFEST_NAME)}: no manifest; the bundle is not complete, "
                "so none of its files is read",
                path=url,
            ) from None

    # -- fetch -------------------------------------------------------------------------------

    def fetch(self, url: str, *, credential_ref: str | None = None) -> FetchResult:
        """Download the bundle at ``url`` into the cache once and return its local view."""
        fs, root = self.open_location(url, credential_ref)
        raw = self._manifest_bytes(fs, root, url)
        manifest = parse_manifest(raw, path=_join(url, fmt.MANIFEST_NAME))
        version = manifest.snapshot.version_id
        try:  # the manifest model applies this rule already; the cache never relies on that
            fmt.check_version_id(version)
        except ValueError as e:
            where = _join(url, fmt.MANIFEST_NAME)
            raise UnsafePath(f"{where}: {e}", path=fmt.MANIFEST_NAME) from None
        downloaded = reused = nbytes = hashed = 0
        # One fetcher per version at a time: the others wait, then find every object present
        # and the view current (nothing downloaded or hashed twice, no view rebuilt under them).
        with self._version_lock(version):
            todo = []
            for entry in manifest.bound_files:
                if self._have(entry):
                    reused += 1
                    continue
                if self.object_path(entry.sha256).exists():  # present but unrecorded: check it
                    hashed += entry.bytes
                    if self._adopt(entry):
                        reused += 1
                        continue
                todo.append(entry)
            # One file per core at a time: each copy's fsync and each file's sha256 overlap
            # with the others' (one file after another, a large bundle ran at the speed of one
            # core's sha256 plus the disk, measured in bench/chain.py).
            workers = max(1, min(cpu_count(), len(todo)))
            failed = threading.Event()

            def download(entry: FileEntry) -> None:
                if failed.is_set():  # a file already failed: start no new download
                    return
                try:
                    self._download(fs, posixpath.join(root, entry.path), entry, url)
                except BaseException:
                    failed.set()
                    raise

            with ThreadPoolExecutor(workers) as pool:
                futures = [pool.submit(download, e) for e in todo]
            for f in futures:
                f.result()  # the first failure in manifest order
            downloaded = len(todo)
            nbytes = hashed_new = sum(e.bytes for e in todo)
            hashed += hashed_new
            view = self._materialize(manifest, raw)
        return FetchResult(view, manifest, nbytes, downloaded, reused, hashed)

    def object_path(self, sha256: str) -> Path:
        """Where the cache keeps the file whose content has this sha256."""
        return self.objects_dir / sha256

    def _ledger_path(self, sha256: str) -> Path:
        return self.ledger_dir / f"{sha256}.json"

    def _ledger_matches(self, sha256: str) -> bool:
        """Whether the object is still the file that was hashed when it entered the cache."""
        try:
            recorded = Fingerprint.from_dict(json.loads(self._ledger_path(sha256).read_text()))
        except (FileNotFoundError, ValueError):
            return False
        return matches(self.object_path(sha256), recorded)

    def _have(self, entry: FileEntry) -> bool:
        try:
            st = os.stat(self.object_path(entry.sha256))
        except FileNotFoundError:
            return False
        return (
            st.st_size == entry.bytes
            and not st.st_mode & 0o222
            and self._ledger_matches(entry.sha256)
        )

    def _adopt(self, entry: FileEntry) -> bool:
        """Re-check an object with no valid ledger entry; keep it if its bytes are right.

        Another version's fetch may be adopting or replacing the same object at the same time
        (objects are shared between versions): an object gone meanwhile is simply not adopted.
        """
        obj = self.object_path(entry.sha256)
        try:
            if obj.stat().st_size == entry.bytes and sha256_file(obj) == entry.sha256:
                os.chmod(obj, 0o444)
                self._record(entry.sha256, obj)
                return True
        except FileNotFoundError:
            return False
        _remove(obj)
        return False

    def _record(self, sha256: str, obj: Path) -> None:
        fp = Fingerprint.of(obj).as_dict()
        atomic_write_text(self._ledger_path(sha256), json.dumps(fp) + "\n")

    def _download(
        self, fs: fsspec.AbstractFileSystem, remote: str, entry: FileEntry, url: str
    ) -> None:
        tmp = self.objects_dir / f".incoming-{entry.sha256[:16]}-{secrets.token_hex(6)}"
        where = _join(url, entry.path)
        try:
            size = 0
            with fs.open(remote, "rb") as src, open(tmp, "xb") as dst:
                while chunk := src.read(_COPY_CHUNK):
                    size += len(chunk)
                    if size > entry.bytes:
                        raise SizeMismatch(
                            f"{where}: expected {entry.bytes} bytes, the download is longer",
                            path=entry.path,
                        )
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if size != entry.bytes:
                raise SizeMismatch(
                    f"{where}: expected {entry.bytes} bytes, downloaded {size}", path=entry.path
                )
            digest = sha256_file(tmp)
            if digest != entry.sha256:
                raise DigestMismatch(
                    f"{where}: sha256 expected {entry.sha256} (manifest), downloaded {digest}; "
                    "nothing was kept",
                    path=entry.path,
                )
            os.chmod(tmp, 0o444)
            obj = self.object_path(entry.sha256)
            try:
                rename_noreplace(tmp, obj)
            except FileExistsError:  # another fetch won the race with the same bytes
                _remove(tmp)
                if not self._have(entry):
                    self._adopt(entry)
                return
            fsync_dir(self.objects_dir)
            self._record(entry.sha256, obj)
        except BaseException:
            _remove(tmp)
            raise

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
            os.chmod(tmp / fmt.MANIFEST_NAME, 0o444)
            fsync_dir(tmp / fmt.PARTS_DIR)
            if os.path.lexists(view):  # links objects since replaced (tampered): retire it
                stale = self.bundles_dir / f".{version}.stale-{secrets.token_hex(6)}"
                os.rename(view, stale)
                shutil.rmtree(stale, ignore_errors=True)
            rename_noreplace(tmp, view)  # under the version lock nobody else publishes it
            fsync_dir(self.bundles_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return view

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
        describes it (size, mtime_ns, inode). A copy, a rewritten or a writable file is hashed.
        """
        try:
            st = os.stat(path)
            ost = os.stat(self.object_path(entry.sha256))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return (
            (st.st_dev, st.st_ino) == (ost.st_dev, ost.st_ino)
            and stat.S_ISREG(ost.st_mode)
            and not ost.st_mode & 0o222
            and ost.st_size == entry.bytes
            and self._ledger_matches(entry.sha256)
        )

    def verify(self, path: str | os.PathLike[str]) -> VerifiedSnapshot:
        """Verify a bundle view of this cache: every rule, hashing only what the cache cannot
        vouch for (see :meth:`trusted`)."""
        return verify(path, trusted=self.trusted)

    # -- publish -----------------------------------------------------------------------------

    def staging_dir(self) -> Path:
        """Where to :func:`~pipeline.bundle.stage.stage` a bundle that :meth:`publish` adopts
        (inside the cache, so adopting it is a rename, not a copy)."""
        d = self.cache_dir / "staging"
        d.mkdir(parents=True, exist_ok=True)
        return d

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
        shutil.rmtree(root, ignore_errors=True)
        return self.verify(view)

    def _adopt_staged(self, root: Path, manifest: Manifest, raw: bytes) -> Path:
        """Move a staged bundle's files into the objects and materialise its view (locked)."""
        for entry in manifest.bound_files:
            obj = self.object_path(entry.sha256)
            if self._have(entry) or (obj.exists() and self._adopt(entry)):
                continue  # the same bytes are already an object (an earlier identical output)
            src = root / entry.path
            os.chmod(src, 0o444)
            try:
                rename_noreplace(src, obj)
            except FileExistsError:  # a concurrent fetch published the same bytes first
                if not self._have(entry):
                    self._adopt(entry)
                continue
            fsync_dir(self.objects_dir)
            self._record(entry.sha256, obj)
        return self._materialize(manifest, raw)


def _remove(path: Path) -> None:
    try:
        os.chmod(path, 0o600)
        path.unlink()
    except FileNotFoundError:
        pass


def _join(url: str, rel: str) -> str:
    return f"{url.rstrip('/')}/{rel}"
