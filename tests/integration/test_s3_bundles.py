"""Bundles in object storage, against a real S3 API (moto's server, s3fs as the client).

The store is read and written the way a user's process does it: the endpoint from
``AWS_ENDPOINT_URL_S3``, the secret only through a credential reference. The server checks every
request's signature, so a fetch that succeeds proves the referenced secret was used. A fetch or
an upload is interrupted by killing a real child process at a known point (see
``tests/helpers/s3_stalled.py``), then completed by this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import sha256_file
from pipeline.bundle.errors import BundleExists, DigestMismatch, IncompleteBundle, SizeMismatch
from pipeline.bundle.stage import stage
from pipeline.bundle.verify import VerifiedSnapshot
from resources.bundle_store import BundleStore, ManifestChanged
from resources.credentials import CredentialRegistry
from resources.settings import REPO_ROOT
from tests.helpers.bundles import make_input
from tests.helpers.s3 import REF, SECRET_ENV, S3Store, child_env

CHUNK = 64 * 1024


def _store(cache, **kw) -> BundleStore:
    return BundleStore(cache, CredentialRegistry({REF: SECRET_ENV}), **kw)


@pytest.fixture
def remote(tmp_path, s3) -> tuple[VerifiedSnapshot, str]:
    """A small bundle (3 parts) uploaded to a new bucket: the local original and its URL."""
    snap = make_input(tmp_path / "src" / "v1")
    return snap, s3.upload_dir(snap.root, f"s3://{s3.new_bucket()}/bundles/v1")


def _key(url: str, rel: str = "") -> str:
    return f"{url.removeprefix('s3://')}/{rel}".rstrip("/")


def test_a_bundle_in_s3_is_fetched_with_the_referenced_secret_and_verifies(
    tmp_path, s3, remote, monkeypatch
):
    snap, url = remote
    store = _store(tmp_path / "cache")
    assert store.source(url, credential_ref=REF).manifest == snap.manifest
    got = store.fetch(url, credential_ref=REF)
    total = sum(e.bytes for e in snap.manifest.bound_files)
    assert (got.files_downloaded, got.bytes_downloaded, got.bytes_resumed) == (3, total, 0)
    assert store.verify(got.path).identity == snap.identity
    again = store.fetch(url, credential_ref=REF)
    assert (again.files_downloaded, again.files_reused, again.bytes_downloaded) == (0, 3, 0)

    # The server checks signatures: the same fetch with a wrong secret is refused (403).
    monkeypatch.setenv(SECRET_ENV, f"{s3.access_key}:not-the-secret")
    other = _store(tmp_path / "other")
    with pytest.raises(PermissionError):
        other.fetch(url, credential_ref=REF)
    assert list(other.objects_dir.iterdir()) == list(other.bundles_dir.iterdir()) == []


@pytest.mark.parametrize("change", ["same size", "longer"])
def test_a_part_whose_bytes_do_not_match_the_manifest_is_refused_by_name(
    tmp_path, s3, remote, change
):
    snap, url = remote
    bad = snap.manifest.parts[1]
    data = bytearray((snap.root / bad.path).read_bytes())
    if change == "same size":
        data[len(data) // 2] ^= 0xFF
    else:
        data += b"\0"
    s3.fs().pipe_file(_key(url, bad.path), bytes(data))
    store = _store(tmp_path / "cache")
    error = DigestMismatch if change == "same size" else SizeMismatch
    with pytest.raises(error) as e:
        store.fetch(url, credential_ref=REF)
    assert f"{url}/{bad.path}" in str(e.value) and e.value.path == bad.path
    assert not store.object_path(bad.sha256).exists()
    assert list(store.incoming_dir.iterdir()) == []  # nothing of it is kept, even partly
    assert list(store.bundles_dir.iterdir()) == []


def test_a_manifest_changed_during_the_download_is_refused(tmp_path, s3, remote, monkeypatch):
    snap, url = remote
    other = make_input(tmp_path / "src" / "other", n=20)
    replaced = []
    download = BundleStore._download

    def replace_manifest_after_the_first_file(self, *args):
        out = download(self, *args)
        if not replaced:  # the store now holds another bundle's manifest under this prefix
            s3.fs().put_file(str(other.root / fmt.MANIFEST_NAME), _key(url, fmt.MANIFEST_NAME))
            replaced.append(True)
        return out

    monkeypatch.setattr(BundleStore, "_download", replace_manifest_after_the_first_file)
    store = _store(tmp_path / "cache")
    with pytest.raises(ManifestChanged, match="changed while the bundle was downloaded"):
        store.fetch(url, credential_ref=REF)
    assert replaced and list(store.bundles_dir.iterdir()) == []  # no view of either version


def _big_bundle(tmp_path) -> VerifiedSnapshot:
    """Two parts of incompressible floats, each several chunks long."""
    n = 40_000
    table = pa.table(
        {
            "id": [f"item-{i:06d}" for i in range(n)],
            "x": np.random.default_rng(7).random(n),
        }
    )
    snap = stage(table, tmp_path / "src" / "big", id_field="id", kind="input", rows_per_part=n // 2)
    assert all(e.bytes > 3 * CHUNK for e in snap.manifest.parts)
    return snap


def _stalled_child(*args: str, store: S3Store) -> subprocess.Popen:
    """Start ``tests/helpers/s3_stalled.py`` and return once it says it stalled."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.s3_stalled", *args],
        cwd=REPO_ROOT,
        env=child_env(store, PYTHONPATH=str(REPO_ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()  # blocks until the child stalls (or exits)
    if line.strip() != "STALLED":
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the child did not stall: {line!r}\n{err[-3000:]}")
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def test_a_download_killed_mid_part_leaves_nothing_trusted_and_is_resumed(tmp_path, s3):
    snap = _big_bundle(tmp_path)
    url = s3.upload_dir(snap.root, f"s3://{s3.new_bucket()}/bundles/big")
    cut = snap.manifest.parts[1]
    cache = tmp_path / "cache"
    _kill(_stalled_child("fetch", url, str(cache), cut.path, str(CHUNK), store=s3))

    store = _store(cache, chunk_bytes=CHUNK)
    partial = store.incoming_dir / cut.sha256
    assert partial.stat().st_size == CHUNK  # the first chunk arrived, then the process died
    assert not store.object_path(cut.sha256).exists()
    assert not store.trusted(partial, cut)
    assert list(store.bundles_dir.iterdir()) == []  # no view of a bundle not all there
    whole = {obj.name for obj in store.objects_dir.iterdir()}
    for entry in snap.manifest.parts:  # whatever did arrive whole is exactly right
        if entry.sha256 in whole:
            obj = store.object_path(entry.sha256)
            assert store.trusted(obj, entry) and sha256_file(obj) == entry.sha256

    # (the other part was downloading beside it: it may have arrived whole, or partly)
    partials = {p.name: p.stat().st_size for p in store.incoming_dir.iterdir()}

    got = store.fetch(url, credential_ref=REF)
    fetched = [e for e in snap.manifest.parts if e.sha256 not in whole]
    assert got.files_reused == len(whole) and got.files_downloaded == len(fetched)
    # Not started over: every partial file continued from its length, none sent twice.
    assert got.bytes_resumed == sum(partials.values()) >= CHUNK
    assert got.bytes_downloaded == sum(e.bytes for e in fetched) - got.bytes_resumed
    assert store.verify(got.path).identity == snap.identity
    assert list(store.incoming_dir.iterdir()) == []


@pytest.mark.durable  # fsync and the early writeback run as in production
def test_chunks_that_cut_network_pieces_arrive_whole_and_what_is_trusted_is_on_disk(tmp_path, s3):
    snap = _big_bundle(tmp_path)
    url = s3.upload_dir(snap.root, f"s3://{s3.new_bucket()}/bundles/big")
    # An odd chunk size: nearly every chunk ends inside a piece the network delivered, whose
    # rest begins the next chunk; each byte must still be written and hashed once, in order.
    store = _store(tmp_path / "cache", chunk_bytes=100_003)
    got = store.fetch(url, credential_ref=REF)
    total = sum(e.bytes for e in snap.manifest.bound_files)
    assert (got.bytes_downloaded, got.bytes_hashed) == (total, total)
    for entry in snap.manifest.bound_files:  # the digest checked on arrival is the file's
        obj = store.object_path(entry.sha256)
        assert obj.stat().st_size == entry.bytes and sha256_file(obj) == entry.sha256
    assert store.verify(got.path).identity == snap.identity

    # The same store refuses a part whose bytes differ, at this chunk size too.
    bad = snap.manifest.parts[0]
    data = bytearray((snap.root / bad.path).read_bytes())
    data[-1] ^= 0xFF  # the last byte: the end of the last chunk
    s3.fs().pipe_file(_key(url, bad.path), bytes(data))
    with pytest.raises(DigestMismatch) as e:
        _store(tmp_path / "other", chunk_bytes=100_003).fetch(url, credential_ref=REF)
    assert e.value.path == bad.path


def test_a_partial_file_left_whole_is_checked_from_the_disk_not_fetched_again(tmp_path, s3, remote):
    """A fetch killed after the last byte but before the rename: the file is hashed where it
    lies; the right bytes are kept without a GET, wrong bytes of the right size come again."""
    snap, url = remote
    store = _store(tmp_path / "cache")
    right, wrong = snap.manifest.parts[0], snap.manifest.parts[1]
    (store.incoming_dir / right.sha256).write_bytes((snap.root / right.path).read_bytes())
    (store.incoming_dir / wrong.sha256).write_bytes(b"x" * wrong.bytes)
    got = store.fetch(url, credential_ref=REF)
    total = sum(e.bytes for e in snap.manifest.bound_files)
    assert got.bytes_resumed == right.bytes
    assert got.bytes_downloaded == total - right.bytes
    assert store.verify(got.path).identity == snap.identity
    assert list(store.incoming_dir.iterdir()) == []


def test_a_partial_file_with_wrong_bytes_is_fetched_again_from_the_start(tmp_path, s3, remote):
    snap, url = remote
    store = _store(tmp_path / "cache", chunk_bytes=256)
    entry = snap.manifest.parts[0]
    (store.incoming_dir / entry.sha256).write_bytes(b"x" * 300)  # a damaged leftover
    got = store.fetch(url, credential_ref=REF)
    assert got.bytes_resumed == 0  # the prefix did not hash right: that file came again whole
    assert got.bytes_downloaded == sum(e.bytes for e in snap.manifest.bound_files) + (
        entry.bytes - 300
    )
    assert store.verify(got.path).identity == snap.identity


# -- publishing ------------------------------------------------------------------------------


def _objects(s3: S3Store, url: str) -> dict[str, bytes]:
    fs = s3.fs()
    return {p: fs.cat_file(p) for p in fs.find(_key(url))}


def test_a_bundle_published_to_s3_verifies_from_s3_and_is_never_overwritten(tmp_path, s3):
    snap = make_input(tmp_path / "src" / "v1")
    url = f"s3://{s3.new_bucket()}/outputs/{snap.identity.version_id}"
    store = _store(tmp_path / "cache")
    first = store.upload(snap, url, credential_ref=REF)
    assert (first.files_uploaded, first.files_present, first.already_published) == (3, 0, False)
    assert first.bytes_uploaded == sum(e.bytes for e in snap.manifest.bound_files)
    reader = _store(tmp_path / "reader")
    assert reader.verify(reader.fetch(url, credential_ref=REF).path).identity == snap.identity

    there = _objects(s3, url)
    again = store.upload(snap, url, credential_ref=REF)  # the same bundle: nothing is written
    assert (again.files_uploaded, again.already_published) == (0, True)
    assert _objects(s3, url) == there

    impostor = make_input(tmp_path / "src" / "other", n=20)  # other bytes, the same file names
    with pytest.raises(BundleExists, match="never overwritten") as e:
        store.upload(impostor, url, credential_ref=REF)
    assert snap.identity.version_id in str(e.value)
    assert _objects(s3, url) == there  # not one part of the published bundle was touched


def test_a_crash_mid_publish_leaves_no_manifest_and_the_retry_completes(tmp_path, s3):
    snap = make_input(tmp_path / "src" / "v1", n=60)  # 6 parts
    url = f"s3://{s3.new_bucket()}/outputs/{snap.identity.version_id}"
    _kill(_stalled_child("upload", str(snap.root), url, store=s3))

    left = _objects(s3, url)
    assert left and _key(url, fmt.MANIFEST_NAME) not in left  # some parts, never a manifest
    reader = _store(tmp_path / "reader")
    with pytest.raises(IncompleteBundle):  # a reader sees no bundle there, only leftovers
        reader.fetch(url, credential_ref=REF)

    retry = _store(tmp_path / "cache").upload(snap, url, credential_ref=REF)
    assert retry.files_present == len(left)  # what the crash left whole was kept, not resent
    assert retry.files_uploaded == len(snap.manifest.bound_files) - len(left)
    assert reader.verify(reader.fetch(url, credential_ref=REF).path).identity == snap.identity


def test_a_foreign_file_where_a_part_goes_is_never_overwritten(tmp_path, s3):
    snap = make_input(tmp_path / "src" / "v1")
    url = f"s3://{s3.new_bucket()}/outputs/{snap.identity.version_id}"
    part = snap.manifest.parts[0].path
    s3.fs().pipe_file(_key(url, part), b"someone else's bytes")
    with pytest.raises(BundleExists, match=part):
        _store(tmp_path / "cache").upload(snap, url, credential_ref=REF)
    fs = s3.fs()
    assert fs.cat_file(_key(url, part)) == b"someone else's bytes"
    assert not fs.exists(_key(url, fmt.MANIFEST_NAME))


def test_training_artifacts_publish_last_file_last_once_and_never_over_others(tmp_path, s3):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "model.pt").write_bytes(b"weights")
    (run / "record.json").write_text('{"checkpoint": "..."}\n')
    files = {
        "checkpoint/model.pt": run / "checkpoint" / "model.pt",
        "record.json": run / "record.json",
    }
    url = f"s3://{s3.new_bucket()}/outputs/v1.training"
    store = _store(tmp_path / "cache")
    first = store.upload_files(files, url, last="record.json", credential_ref=REF)
    assert (first.files_uploaded, first.already_published) == (1, False)
    assert store.upload_files(files, url, last="record.json", credential_ref=REF).already_published
    (run / "record.json").write_text('{"checkpoint": "another"}\n')
    with pytest.raises(BundleExists, match="never overwritten"):
        store.upload_files(files, url, last="record.json", credential_ref=REF)
    assert s3.fs().cat_file(_key(url, "record.json")) == b'{"checkpoint": "..."}\n'
