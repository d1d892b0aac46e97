"""The index: built from the manifest, located by offsets, pinned by a digest, saved safely."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bundle.errors import NotVerified
from pipeline.bundle.verify import verify
from pipeline.readers import index as index_module
from pipeline.readers.index import Index, IndexMismatch
from tests.helpers.bundles import make_bundle

SIZES = [3, 1, 5, 2]


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    return make_bundle(tmp_path_factory.mktemp("ix"), SIZES)


def test_from_snapshot_follows_the_manifest(snap):
    ix = Index.from_snapshot(snap)
    assert len(ix) == 11
    assert ix.part_rows == SIZES
    assert ix.part_offsets.tolist() == [0, 3, 4, 9, 11]
    assert ix.part_paths == snap.part_paths()
    assert ix.id_field == "item_id" and ix.schema == snap.manifest.schema_
    assert isinstance(ix.ids, pa.ChunkedArray) and ix.ids.type == pa.string()
    assert ix.ids.to_pylist() == [f"{i:05d}" for i in range(11)]


def test_locate_maps_positions_to_part_and_row(snap):
    ix = Index.from_snapshot(snap)
    part, row = ix.locate([0, 2, 3, 4, 8, 9, 10])
    assert part.tolist() == [0, 0, 1, 2, 2, 3, 3]
    assert row.tolist() == [0, 2, 0, 0, 4, 0, 1]
    with pytest.raises(IndexError, match="outside 0..10"):
        ix.locate([11])
    with pytest.raises(IndexError):
        ix.locate(np.array([-1]))


def test_digest_is_stable_and_names_the_bundle(snap, tmp_path):
    a, b = Index.from_snapshot(snap), Index.from_snapshot(verify(snap.root))
    assert a.digest == b.digest and len(a.digest) == 64
    other = Index.from_snapshot(make_bundle(tmp_path, SIZES))  # same rows, new version
    assert other.digest != a.digest


def test_save_and_load_round_trip(snap, tmp_path):
    ix = Index.from_snapshot(snap)
    ix.save(tmp_path / "index.parquet")
    back = Index.load(tmp_path / "index.parquet", snap.root)
    assert back.digest == ix.digest and back.ids.equals(ix.ids)
    assert Index.load(tmp_path / "index.parquet", snapshot=snap).digest == ix.digest
    assert [p.name for p in tmp_path.iterdir()] == ["index.parquet"]  # no temp file left


def test_load_refuses_another_bundle(snap, tmp_path):
    Index.from_snapshot(snap).save(tmp_path / "index.parquet")
    other = make_bundle(tmp_path / "o", SIZES)
    with pytest.raises(IndexMismatch, match="snapshot expected"):
        Index.load(tmp_path / "index.parquet", other.root)


def test_load_refuses_an_edited_index(snap, tmp_path):
    path = tmp_path / "index.parquet"
    Index.from_snapshot(snap).save(path)
    t = pq.read_table(path)
    ids = t.column("id").to_pylist()
    ids[0], ids[1] = ids[1], ids[0]
    pq.write_table(pa.table({"id": ids}).replace_schema_metadata(t.schema.metadata), path)
    with pytest.raises(IndexMismatch, match="ids_sha256"):
        Index.load(path, snap.root)
    pq.write_table(pa.table({"id": ids}), path)
    with pytest.raises(IndexMismatch, match="not a saved index"):
        Index.load(path, snap.root)


def test_load_reverifies_the_bundle(snap, tmp_path):
    from pipeline.bundle.errors import IncompleteBundle

    with pytest.raises(IncompleteBundle):
        Index.load(tmp_path / "index.parquet", tmp_path / "nothing-here")
    with pytest.raises(NotVerified):
        Index.load(tmp_path / "index.parquet", snapshot=snap.manifest)


def test_resolve_columns_always_keeps_id_and_result_columns(snap):
    ix = Index.from_snapshot(snap)
    assert ix.resolve_columns(["x"]) == [
        "item_id",
        "x",
        "lithi_status",
        "lithi_confidence",
        "lithi_verification",
    ]
    assert ix.resolve_columns(None) == snap.manifest.schema_.names
    with pytest.raises(KeyError, match="nope"):
        ix.resolve_columns(["nope"])


@pytest.mark.parametrize("block", [1, 7, 1 << 20])
def test_the_ids_digest_is_the_rebased_offsets_then_the_bytes(block, monkeypatch):
    """Hashed a block of offsets at a time and a chunk at a time, the digest is still sha256 of
    every offset rebased to zero as little-endian int64, then the value bytes: the definition
    saved indexes carry, whatever the chunking."""
    monkeypatch.setattr(index_module, "_DIGEST_OFFSETS", block)
    ids = pa.array([f"item-{i:03d}" * (i % 3 + 1) for i in range(50)] + ["", "é"], pa.string())
    chunked = pa.chunked_array([ids.slice(0, 7), ids.slice(7, 0), ids.slice(7, 30), ids.slice(37)])
    empty = pa.chunked_array([], pa.string())
    for arr in (ids, ids.slice(9, 20), ids.slice(0, 0), chunked, chunked.slice(3, 40), empty):
        whole = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        fresh = pa.concat_arrays([whole]) if len(whole) else pa.array([], pa.string())
        offsets = np.frombuffer(fresh.buffers()[1], dtype=np.int32, count=len(fresh) + 1)
        values = fresh.buffers()[2]
        data = b"" if values is None else values.to_pybytes()[offsets[0] : offsets[-1]]
        want = hashlib.sha256((offsets - offsets[0]).astype("<i8").tobytes() + data).hexdigest()
        assert index_module._ids_sha256(arr) == want


def test_an_index_pickles_as_its_ids_not_the_buffers_its_chunks_share(tmp_path):
    """A chunk read from a file is often a slice of a larger buffer, which Arrow would pickle
    whole for each chunk; a spawned worker receives the ids once."""
    ix = Index.from_snapshot(make_bundle(tmp_path / "b", [3000, 2000]))
    ids = ix.ids.combine_chunks()
    shares = pa.chunked_array([ids.slice(a, 500) for a in range(0, 5000, 500)])  # 10 × the buffer
    shared = Index(ix.snapshot, shares, ix.part_offsets)
    compact = Index(ix.snapshot, pa.chunked_array([ids]), ix.part_offsets)
    data = pickle.dumps(shared)
    assert len(data) < len(pickle.dumps(compact)) + ids.nbytes // 10
    back = pickle.loads(data)
    assert back.ids.equals(ix.ids) and back.digest == ix.digest and len(back) == 5000
