"""Verification receipts: a bundle verified once loads again by a stat per file, until anything
about its files changes."""

from __future__ import annotations

import os

import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle import receipt as receipts
from pipeline.bundle.contents import ids_decoded
from pipeline.bundle.errors import DigestMismatch, UnboundFile
from pipeline.bundle.receipt import verify_once
from resources.bundle_store import BundleStore
from tests.helpers.bundles import edit_in_place, make_input


@pytest.fixture
def staged(tmp_path):
    return make_input(tmp_path / "bundle", n=60, rows_per_part=20)


def _decoding(fn):
    """``fn()``'s result and the ids it decoded to check bundles."""
    before = ids_decoded()
    out = fn()
    return out, ids_decoded() - before


def test_a_second_load_decodes_nothing_and_returns_the_same_snapshot(tmp_path, staged):
    receipt = tmp_path / "receipt.json"
    first, decoded = _decoding(lambda: verify_once(staged.root, receipt))
    assert decoded == 60 and receipt.exists()
    again, decoded = _decoding(lambda: verify_once(staged.root, receipt))
    assert decoded == 0
    assert again == first and again.manifest == staged.manifest
    assert again.stats.bytes_hashed == 0 and again.stats.bytes_total == first.stats.bytes_total


def test_a_part_edited_with_its_size_and_mtime_put_back_is_verified_again_and_refused(
    tmp_path, staged
):
    receipt = tmp_path / "receipt.json"
    verify_once(staged.root, receipt)
    part = staged.manifest.parts[1]
    edit_in_place(staged.root / part.path, part.bytes // 2)
    with pytest.raises(DigestMismatch, match=part.path):
        verify_once(staged.root, receipt)


def test_a_file_dropped_beside_the_bound_ones_is_refused(tmp_path, staged):
    receipt = tmp_path / "receipt.json"
    verify_once(staged.root, receipt)
    os.chmod(staged.root / "parts", 0o755)
    (staged.root / "parts" / "extra.parquet").write_bytes(b"not bound")
    with pytest.raises(UnboundFile, match="extra.parquet"):
        verify_once(staged.root, receipt)


def test_another_bundles_receipt_vouches_for_nothing(tmp_path, staged):
    other = make_input(tmp_path / "other", n=60, rows_per_part=20)
    receipt = tmp_path / "receipt.json"
    verify_once(other.root, receipt)
    _, decoded = _decoding(lambda: verify_once(staged.root, receipt))
    assert decoded == 60  # verified in full, and the receipt now names this bundle
    _, decoded = _decoding(lambda: verify_once(staged.root, receipt))
    assert decoded == 0


def test_a_file_that_changes_while_it_is_verified_gets_no_receipt(tmp_path, staged, monkeypatch):
    real = receipts.check
    manifest = staged.root / fmt.MANIFEST_NAME

    def touched_meanwhile(path, **kw):
        snapshot = real(path, **kw)
        os.chmod(manifest, 0o444)  # same bytes, but its ctime moves
        return snapshot

    monkeypatch.setattr(receipts, "check", touched_meanwhile)
    receipt = tmp_path / "receipt.json"
    verify_once(staged.root, receipt)
    assert not receipt.exists()


def test_the_cache_loads_a_verified_view_by_receipt_and_a_tampered_object_is_refused(tmp_path):
    src = make_input(tmp_path / "src", n=60, rows_per_part=20)
    store = BundleStore(tmp_path / "cache")
    view = store.fetch(str(src.root)).path
    store.verify(view)
    snap, decoded = _decoding(lambda: store.verify(view))
    assert decoded == 0 and snap.identity == src.identity
    assert BundleStore(tmp_path / "cache", rehash=True).verify(view).stats.bytes_hashed > 0
    part = snap.manifest.parts[0]
    edit_in_place(store.object_path(part.sha256), part.bytes // 2)  # mtime and size put back
    with pytest.raises(DigestMismatch, match=part.path):
        store.verify(view)
