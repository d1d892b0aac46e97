"""The bundle store: download once into a content-addressed cache, verify only what is new."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import DigestMismatch, IncompleteBundle
from pipeline.bundle.leftovers import owner
from pipeline.bundle.stage import ReusedPart, stage
from pipeline.bundle.verify import verify
from resources.bundle_store import BundleStore
from tests.helpers.bundles import edit_in_place, write_bytes


def _table(start: int, n: int) -> pa.Table:
    ids = [f"item-{i:05d}" for i in range(start, start + n)]
    return pa.table({"id": ids, "x": pa.array([float(i) for i in range(start, start + n)])})


@pytest.fixture
def bundle(tmp_path):
    return stage(
        _table(0, 1000), tmp_path / "src" / "v1", id_field="id", kind="input", rows_per_part=50
    )


def _newer(tmp_path, first, new_rows: int):
    """A newer version binding all of ``first``'s parts plus ``new_rows`` new items."""
    reuse = [ReusedPart(first.root, e) for e in first.manifest.parts]
    return stage(
        _table(1000, new_rows),
        tmp_path / "src" / "v2",
        id_field="id",
        kind="input",
        rows_per_part=50,
        reuse_parts=reuse,
    )


def test_fetch_downloads_once_and_views_are_hard_links_to_read_only_objects(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache", link=False)
    got = store.fetch(bundle.root.as_uri())  # a file:// URL
    total = sum(e.bytes for e in bundle.manifest.bound_files)
    assert (got.files_downloaded, got.files_reused, got.bytes_downloaded) == (20, 0, total)
    assert got.files_linked == 0
    assert got.path == tmp_path / "cache" / "bundles" / bundle.identity.version_id
    assert got.manifest == bundle.manifest
    for entry in got.manifest.parts:
        obj = store.object_path(entry.sha256)
        assert os.stat(obj).st_ino == os.stat(got.path / entry.path).st_ino
        assert os.stat(obj).st_mode & 0o777 == 0o444
    snap = verify(got.path, trusted=store.trusted)
    assert snap.identity == bundle.identity and snap.stats.bytes_hashed == 0  # hashed on arrival

    again = store.fetch(str(bundle.root))  # a plain path: the same bundle, nothing downloaded
    assert (again.files_downloaded, again.files_reused, again.bytes_downloaded) == (0, 20, 0)
    assert again.path == got.path


def test_rebuild_after_a_small_resubmission_costs_only_the_new_bytes(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache", link=False)
    store.fetch(str(bundle.root))
    newer = _newer(tmp_path, bundle, new_rows=50)  # one new part: 50 of 1,050 items (~5%)
    new_entries = [
        e
        for e in newer.manifest.bound_files
        if e.sha256 not in {b.sha256 for b in bundle.manifest.bound_files}
    ]
    new_bytes = sum(e.bytes for e in new_entries)
    assert len(new_entries) == 1

    got = store.fetch(str(newer.root))
    snap = verify(got.path, trusted=store.trusted)
    assert got.bytes_downloaded == new_bytes and got.files_downloaded == 1
    assert got.bytes_hashed == new_bytes and got.files_reused == 20
    assert snap.stats.bytes_hashed == 0 and snap.stats.bytes_total > 15 * new_bytes
    # without the trust function every byte is hashed: the saving is real, not skipped checks
    assert verify(got.path).stats.bytes_hashed == snap.stats.bytes_total
    # the first view is untouched and still verifies
    verify(tmp_path / "cache" / "bundles" / bundle.identity.version_id, trusted=store.trusted)


def test_trusted_only_vouches_for_the_verified_object_itself(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache", link=False)
    got = store.fetch(str(bundle.root))
    entry = got.manifest.parts[0]
    assert store.trusted(got.path / entry.path, entry)
    assert not store.trusted(bundle.root / entry.path, entry)  # same bytes, other inode
    assert not store.trusted(got.path / got.manifest.parts[1].path, entry)  # another object
    obj = store.object_path(entry.sha256)
    os.chmod(obj, 0o644)  # writable: could have been changed since it was hashed
    assert not store.trusted(got.path / entry.path, entry)
    os.chmod(obj, 0o444)
    os.utime(obj, ns=(0, 0))  # mtime no longer what the ledger recorded
    assert not store.trusted(got.path / entry.path, entry)


def test_an_in_place_edit_with_the_mtime_put_back_is_not_trusted(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache", link=False)
    got = store.fetch(str(bundle.root))
    entry = got.manifest.parts[0]
    assert store.trusted(got.path / entry.path, entry)
    edit_in_place(store.object_path(entry.sha256), entry.bytes // 2)
    assert not store.trusted(got.path / entry.path, entry)  # only the ctime says so
    with pytest.raises(DigestMismatch, match=entry.path):
        store.verify(got.path)
    again = BundleStore(tmp_path / "cache", link=False).fetch(
        str(bundle.root)
    )  # replaced, not trusted
    assert again.files_downloaded == 1 and store.verify(again.path).identity == bundle.identity


def test_views_sharing_objects_stay_trusted_and_rehash_checks_every_byte(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache")
    first = store.fetch(str(bundle.root))
    second = store.fetch(str(_newer(tmp_path, bundle, new_rows=50).root))  # links shared objects
    for view in (first.path, second.path):  # a new link is not a change of the bytes
        assert store.verify(view).stats.bytes_hashed == 0
    rehash = BundleStore(tmp_path / "cache", rehash=True)
    snap = rehash.verify(second.path)
    assert snap.stats.bytes_hashed == snap.stats.bytes_total > 0


def test_no_manifest_means_incomplete_and_nothing_downloaded(tmp_path, bundle):
    (bundle.root / fmt.MANIFEST_NAME).unlink()
    store = BundleStore(tmp_path / "cache")
    with pytest.raises(IncompleteBundle, match="no manifest"):
        store.fetch(str(bundle.root))
    with pytest.raises(IncompleteBundle):
        store.read_manifest(str(bundle.root))
    assert list(store.objects_dir.iterdir()) == [] and list(store.bundles_dir.iterdir()) == []


def test_digest_mismatch_during_download_keeps_nothing_of_that_file(tmp_path, bundle):
    bad = bundle.manifest.parts[3]
    p = bundle.root / bad.path
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    write_bytes(p, bytes(data))
    store = BundleStore(tmp_path / "cache")
    with pytest.raises(DigestMismatch, match=bad.sha256):
        store.fetch(str(bundle.root))
    names = [o.name for o in store.objects_dir.iterdir()]
    assert bad.sha256 not in names and not [n for n in names if n.startswith(".")]
    assert list(store.bundles_dir.iterdir()) == []  # no view of a bundle that failed
    # the parts that did arrive intact are verified objects, reused by the next try (files
    # download in parallel, so a part after the bad one may have arrived too)
    entries = {e.sha256: e for e in bundle.manifest.parts}
    assert {e.sha256 for e in bundle.manifest.parts[:3]} <= set(names) <= set(entries)
    assert all(store.trusted(store.object_path(h), entries[h]) for h in names)


def test_a_tampered_cache_object_is_re_checked_and_replaced(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache", link=False)  # a copy: the source is another file
    store.fetch(str(bundle.root))
    entry = bundle.manifest.parts[0]
    obj = store.object_path(entry.sha256)
    os.chmod(obj, 0o644)
    obj.write_bytes(b"x" * entry.bytes)  # same size, wrong bytes, ledger no longer matches
    other = BundleStore(tmp_path / "cache", link=False)
    got = other.fetch(str(bundle.root))
    assert got.files_downloaded == 1 and got.bytes_downloaded == entry.bytes
    assert got.bytes_hashed == 2 * entry.bytes  # the suspect object re-checked, then the download
    assert other.trusted(obj, entry)
    assert verify(got.path, trusted=other.trusted).identity == bundle.identity


def test_an_existing_view_with_other_content_is_refused(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache")
    store.fetch(str(bundle.root))
    impostor = stage(
        _table(5000, 10),
        tmp_path / "src" / "other",
        id_field="id",
        kind="input",
        version_id=bundle.identity.version_id,
    )
    with pytest.raises(DigestMismatch, match="cached view"):
        store.fetch(str(impostor.root))


def test_rebuild_after_resubmitting_5_percent_hashes_about_5_percent(tmp_path):
    from pipeline.defs.samples import stage_sample
    from resources.compute.client import JobSpec
    from resources.compute.faults import FaultSpec
    from resources.compute.local import LocalCompute

    inp, ref = stage_sample("digits", tmp_path / "staged")
    compute = LocalCompute(tmp_path / "compute", executor="inline")
    spec = JobSpec(
        input_url=str(inp.root),
        reference_url=str(ref.root),
        rows_per_part=90,
        faults=FaultSpec(lose_fraction=0.05),
    )
    job = compute.submit(spec)
    v1 = compute.status(job).latest_version_id
    store = BundleStore(tmp_path / "cache", link=False)
    first = store.fetch(compute.manifest_url(job))
    compute.resubmit(job, from_version_id=v1, idempotency_key="once")
    assert compute.status(job).state == "SUCCEEDED"

    second = store.fetch(compute.manifest_url(job))
    snap = verify(second.path, trusted=store.trusted)
    known = {e.sha256 for e in first.manifest.bound_files}
    new = [e for e in second.manifest.bound_files if e.sha256 not in known]
    new_bytes = sum(e.bytes for e in new)
    assert sum(e.rows for e in new) == 90  # ceil(0.05 * 1797) resubmitted items, one new part
    assert second.bytes_downloaded == second.bytes_hashed == new_bytes
    assert snap.stats.bytes_hashed == 0
    share = (second.bytes_hashed + snap.stats.bytes_hashed) / snap.stats.bytes_total
    assert 0.02 < share < 0.08, share  # about 5% of the bytes, as for the items


def _read_only(monkeypatch, root: Path) -> None:
    """Make every write under ``root`` fail as on a read-only mount (EROFS), root or not."""
    root_text = str(root)

    def refuse(real, writes=lambda *a, **k: True):
        def call(path, *args, **kwargs):
            if str(path).startswith(root_text) and writes(path, *args, **kwargs):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real(path, *args, **kwargs)

        return call

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    monkeypatch.setattr(os, "open", refuse(os.open, lambda p, flags, *a, **k: flags & write_flags))
    for name in ("mkdir", "link", "rename", "replace", "unlink", "rmdir", "chmod", "utime"):
        monkeypatch.setattr(os, name, refuse(getattr(os, name)))


def test_a_read_only_cache_serves_the_bundles_it_holds(tmp_path, bundle, monkeypatch):
    store = BundleStore(tmp_path / "cache")
    first = store.fetch(str(bundle.root))
    _read_only(monkeypatch, tmp_path / "cache")
    with pytest.raises(OSError, match="Read-only"):  # the simulation holds
        os.open(tmp_path / "cache" / "locks" / "probe.lock", os.O_RDWR | os.O_CREAT)
    again = BundleStore(tmp_path / "cache").fetch(str(bundle.root))
    assert again.path == first.path and again.files_downloaded == 0
    assert store.verify(again.path).stats.bytes_hashed == 0


# -- a local source's read-only files are linked, not copied --------------------------------------


def _inode(path: Path) -> int:
    return os.stat(path).st_ino


def test_a_local_read_only_file_is_linked_into_the_cache_not_copied(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache")
    got = store.fetch(str(bundle.root))
    total = sum(e.bytes for e in bundle.manifest.bound_files)
    assert (got.files_downloaded, got.files_linked, got.bytes_downloaded) == (20, 20, 0)
    assert got.bytes_hashed == total  # hashed on arrival all the same
    for entry in bundle.manifest.bound_files:
        source = bundle.root / entry.path
        assert (
            _inode(store.object_path(entry.sha256))
            == _inode(source)
            == _inode(got.path / entry.path)
        )
        assert os.stat(source).st_mode & 0o777 == 0o444  # the source's mode is untouched
    assert store.verify(got.path).stats.bytes_hashed == 0  # vouched for by the ledger
    assert os.listdir(store.incoming_dir) == []  # no link left behind


def test_a_writable_source_file_is_copied_and_the_others_linked(tmp_path, bundle):
    writable = bundle.manifest.parts[2]
    os.chmod(bundle.root / writable.path, 0o644)  # its producer may still change it
    store = BundleStore(tmp_path / "cache")
    got = store.fetch(str(bundle.root))
    assert (got.files_linked, got.bytes_downloaded) == (19, writable.bytes)
    obj = store.object_path(writable.sha256)
    assert _inode(obj) != _inode(bundle.root / writable.path)
    assert os.stat(obj).st_mode & 0o777 == 0o444
    assert os.stat(bundle.root / writable.path).st_mode & 0o777 == 0o644
    (bundle.root / writable.path).write_bytes(b"changed")  # the copy is not
    assert store.verify(got.path).identity == bundle.identity


def test_a_store_made_not_to_link_copies_every_file(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache", link=False)
    got = store.fetch(str(bundle.root))
    assert got.files_linked == 0
    assert got.bytes_downloaded == sum(e.bytes for e in bundle.manifest.bound_files)
    for entry in bundle.manifest.bound_files:
        assert _inode(store.object_path(entry.sha256)) != _inode(bundle.root / entry.path)


def test_a_source_on_another_file_system_is_copied(tmp_path, bundle):
    here = os.stat(tmp_path).st_dev
    others = [
        d
        for d in (Path(tempfile.gettempdir()), Path("/dev/shm"), Path("/var/tmp"))
        if d.is_dir() and os.access(d, os.W_OK) and os.stat(d).st_dev != here
    ]
    if not others:
        pytest.skip("no writable folder on another file system than the test's own")
    cache = Path(tempfile.mkdtemp(dir=others[0]))
    try:
        got = BundleStore(cache).fetch(str(bundle.root))
        assert got.files_linked == 0
        assert got.bytes_downloaded == sum(e.bytes for e in bundle.manifest.bound_files)
    finally:
        shutil.rmtree(cache)


def test_a_linked_source_edited_in_place_is_refused_never_read(tmp_path, bundle):
    """A linked object is the source file itself: edited in place (mode and mtime put back),
    the ledger no longer vouches for it, and the bundle is hashed again and refused by name,
    by a load and by a new fetch alike; nothing heals it from a source that changed."""
    store = BundleStore(tmp_path / "cache")
    got = store.fetch(str(bundle.root))
    store.verify(got.path)  # verified once: a receipt
    entry = bundle.manifest.parts[0]
    edit_in_place(bundle.root / entry.path, entry.bytes // 2)
    with pytest.raises(DigestMismatch, match=entry.path):
        store.verify(got.path)
    with pytest.raises(DigestMismatch, match=entry.sha256):
        BundleStore(tmp_path / "cache").fetch(str(bundle.root))
    assert os.stat(bundle.root / entry.path).st_mode & 0o777 == 0o444  # still the user's mode


def test_a_source_that_moves_while_it_is_hashed_is_copied_instead(tmp_path, bundle, monkeypatch):
    """A file whose fingerprint moves while it is hashed (its producer still at work) is not
    vouched for as linked: it is copied, and the copy is what is hashed."""
    import resources.bundle_store as bundle_store

    touched = bundle.manifest.parts[4]
    hash_file = bundle_store.sha256_file

    def hash_and_touch(path):
        digest = hash_file(path)
        if Path(path).name.startswith(touched.sha256):  # the link, mid-fetch
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        return digest

    monkeypatch.setattr(bundle_store, "sha256_file", hash_and_touch)
    store = BundleStore(tmp_path / "cache")
    got = store.fetch(str(bundle.root))
    assert (got.files_linked, got.bytes_downloaded) == (19, touched.bytes)
    assert _inode(store.object_path(touched.sha256)) != _inode(bundle.root / touched.path)
    assert store.verify(got.path).identity == bundle.identity


def test_a_link_a_killed_fetch_left_is_swept(tmp_path, bundle):
    store = BundleStore(tmp_path / "cache")
    entry = bundle.manifest.parts[0]
    left = store.incoming_dir / f"{entry.sha256}.link-999999999-{owner().split('-')[1]}"
    os.link(bundle.root / entry.path, left)
    store.fetch(str(bundle.root))
    assert not left.exists()
