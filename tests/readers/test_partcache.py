"""Decoded parts shared by a rank's workers: decoded once per rank, same batches, no leftovers."""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pipeline.readers.map_style as map_style
from pipeline.bundle import format as fmt
from pipeline.readers import Index, MapDataset, make_loader, partcache, set_epoch
from pipeline.readers.partcache import PREFIX, SharedPartMismatch, SharedParts, sweep_stale
from pipeline.readers.tensors import POSITION_KEY, to_batch
from tests.helpers.bundles import make_bundle, result_table, row_groups_of, stage_result
from tests.helpers.readers import (
    UNEVEN_SIZES,
    epoch_batches,
    shared_parts_loader,
)
from tests.helpers.timing import limit, wait_until


def _count_decodes(monkeypatch, log: Path) -> None:
    """Every part decode appends its part number to ``log`` (visible from forked workers)."""
    real = map_style._read_part

    def logged(index, p, columns):
        with open(log, "a") as f:  # O_APPEND: whole lines from every forked worker
            f.write(f"{p}\n")
        return real(index, p, columns)

    monkeypatch.setattr(map_style, "_read_part", logged)


def _decodes(log: Path) -> list[int]:
    return sorted(int(x) for x in log.read_text().split()) if log.exists() else []


@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 2)])
def test_each_part_is_decoded_once_per_rank_by_two_workers(
    index, tmp_path, monkeypatch, rank, world
):
    log = tmp_path / "decodes.txt"
    _count_decodes(monkeypatch, log)
    # 4 batches a message: each worker's first message touches every part of the share
    loader = shared_parts_loader(index, transfer_batches=4, rank=rank, world_size=world)
    parts = sorted({int(p) for p in index.locate(loader.sampler.positions())[0]})
    first = epoch_batches(loader, 0)
    assert _decodes(log) == parts  # once each, whichever worker got there first
    second = epoch_batches(loader, 1)  # warm: persistent workers map what was published
    assert _decodes(log) == parts
    assert sorted(x for b in first for x in b) == sorted(x for b in second for x in b)
    shared = loader.dataset.shared
    assert shared.published() == parts


def test_fresh_workers_reuse_the_published_parts(index, tmp_path, monkeypatch):
    log = tmp_path / "decodes.txt"
    _count_decodes(monkeypatch, log)
    loader = shared_parts_loader(index, transfer_batches=4, persistent_workers=False)
    epoch_batches(loader, 0)
    epoch_batches(loader, 1)  # new worker processes: nothing decoded again
    assert _decodes(log) == list(range(len(UNEVEN_SIZES)))


def test_shared_and_private_decoding_give_the_same_batches(index):
    for epoch in (0, 2):
        shared = shared_parts_loader(index, transfer_batches=4)
        private = shared_parts_loader(index, transfer_batches=4, share_decoded=False)
        assert private.dataset.shared is None and shared.dataset.shared is not None
        a, b = epoch_batches(shared, epoch), epoch_batches(private, epoch)
        assert a == b and sum(len(x) for x in a) == len(index)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory) -> Index:
    """The same rows in parts of many row groups: a decoded part is kept as its row groups."""
    with row_groups_of(32):
        snap = make_bundle(tmp_path_factory.mktemp("groups"), UNEVEN_SIZES)
    assert pq.ParquetFile(snap.part_paths()[1]).num_row_groups == 10
    return Index.from_snapshot(snap)


def _plain_batch(plain: pa.Table, positions, schema) -> dict:
    """The batch a reader yields for ``positions``, built from a plain read of every part."""
    want = to_batch(plain.take(positions), schema)
    want[POSITION_KEY] = torch.as_tensor(np.asarray(positions, dtype=np.int64))
    return want


def _assert_rows_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype, k
            torch.testing.assert_close(got[k], v, rtol=0, atol=0, equal_nan=True, msg=k)
        else:
            assert got[k] == v, k


@pytest.mark.parametrize("combined", [True, False], ids=["combined", "row-groups"])
@pytest.mark.parametrize(
    ("workers", "share"),
    [(0, False), (2, True), (2, False)],
    ids=["in-process", "shared", "private"],
)
def test_every_column_across_row_groups_equals_a_plain_read(
    grouped, workers, share, combined, monkeypatch
):
    if not combined:  # as for a part whose strings overflow 32-bit offsets when combined
        monkeypatch.setattr(
            MapDataset, "_decode", lambda ds, p: map_style._read_part(ds.index, p, ds.columns)
        )
    plain = pa.concat_tables(pq.read_table(p) for p in grouped.part_paths)
    kw = {} if workers else {"multiprocessing_context": None}
    loader = shared_parts_loader(
        grouped, num_workers=workers, share_decoded=share, batch_size=50, **kw
    )
    for epoch in (0, 1):
        set_epoch(loader, epoch)
        order = loader.sampler.positions()
        done = 0
        for batch in loader:
            want = _plain_batch(plain, order[done : done + 50], grouped.schema)
            _assert_rows_equal(batch, want)
            done += 50
        assert done >= len(grouped)


def test_result_columns_read_dictionary_encoded_equal_a_plain_read(tmp_path):
    """lithi_status and lithi_verification are read dictionary-encoded; nulls and many distinct
    values come through both readers exactly as a plain read gives them."""
    n = 300
    table = result_table(n)
    verification = [None if i % 7 == 0 else f"method-{i % 40}" for i in range(n)]
    table = table.set_column(
        table.schema.get_field_index(fmt.VERIFICATION_COLUMN),
        fmt.VERIFICATION_COLUMN,
        pa.array(verification, pa.string()),
    )
    with row_groups_of(32):  # a dictionary per row group
        index = Index.from_snapshot(stage_result(table, tmp_path / "b", rows_per_part=100))
    assert map_style.coded_columns(index, index.schema.names) == list(map_style.CODED_COLUMNS)
    part = map_style._read_part(index, 0, index.schema.names)
    assert pa.types.is_dictionary(part.schema.field(fmt.STATUS_COLUMN).type)
    plain = pa.concat_tables(pq.read_table(p) for p in index.part_paths)
    for workers, share in ((0, False), (2, True)):
        kw = {} if workers else {"multiprocessing_context": None}
        loader = shared_parts_loader(
            index, num_workers=workers, share_decoded=share, batch_size=64, **kw
        )
        order = loader.sampler.positions()
        for k, batch in enumerate(loader):
            want = _plain_batch(plain, order[64 * k : 64 * (k + 1)], index.schema)
            _assert_rows_equal(batch, want)
    streamed = [
        x
        for b in make_loader(index, style="iterable", batch_size=64, num_workers=0, shuffle=True)
        for x in zip(b["id"], b[fmt.VERIFICATION_COLUMN], b[fmt.STATUS_COLUMN], strict=True)
    ]
    truth = dict(
        zip(
            plain.column("id").to_pylist(),
            zip(verification, plain.column(fmt.STATUS_COLUMN).to_pylist(), strict=True),
            strict=True,
        )
    )
    assert sorted(streamed) == sorted((i, v, s) for i, (v, s) in truth.items())


def test_opting_out_or_bounding_the_cache_creates_no_directory(index):
    assert (
        shared_parts_loader(index, num_workers=0, multiprocessing_context=None).dataset.shared
        is None
    )
    assert MapDataset(index, share_decoded=False).shared is None
    assert MapDataset(index, max_cached_parts=2).shared is None  # bounded memory stays bounded
    assert MapDataset(index, max_cached_parts=2, share_decoded=True).shared is not None


def test_the_main_process_never_publishes(index, tmp_path, monkeypatch):
    log = tmp_path / "decodes.txt"
    _count_decodes(monkeypatch, log)
    ds = MapDataset(index)
    ds.__getitems__(list(range(len(index))))
    assert ds.shared.published() == [] and _decodes(log) == list(range(len(UNEVEN_SIZES)))


def test_the_directory_goes_with_the_dataset(index):
    loader = shared_parts_loader(index, transfer_batches=4)
    epoch_batches(loader, 0)
    path = Path(loader.dataset.shared.path)
    assert path.parent == Path(partcache.default_root()) and path.name.startswith(PREFIX)
    assert (path.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in path.glob("*.arrow")) == [f"{p}.arrow" for p in range(7)]
    del loader
    gc.collect()
    assert not path.exists()


def test_the_sweep_spares_live_owners_other_namespaces_and_other_names(tmp_path):
    ns = partcache._pid_namespace()
    dead_pid = os.fork()
    if dead_pid == 0:  # the child exits at once, without running anything of this process
        os._exit(0)
    os.waitpid(dead_pid, 0)  # a pid that just exited, and was reaped
    live = tmp_path / f"{PREFIX}{ns}-{os.getpid()}-abc"
    elsewhere = tmp_path / f"{PREFIX}{ns}0-{dead_pid}-abc"  # another container's namespace
    stale = tmp_path / f"{PREFIX}{ns}-{dead_pid}-abc"
    other = tmp_path / f"{PREFIX}{ns}-notapid"
    unrelated = tmp_path / "something-else"
    for d in (live, elsewhere, stale, other, unrelated):
        d.mkdir()
    assert sweep_stale(str(tmp_path)) == [str(stale)]
    assert all(d.exists() for d in (live, elsewhere, other, unrelated))


def _decoder(calls: list[int]):
    def decode(p: int) -> pa.Table:
        calls.append(p)
        return pa.table({"v": pa.array([p] * 3, pa.int64())})

    return decode


def _tags(n: int) -> list[dict]:
    return [{"snapshot": "s", "part": f"p{i}", "sha256": "0" * 64, "rows": 3} for i in range(n)]


def test_a_worker_decodes_other_parts_while_one_is_locked_then_waits(tmp_path):
    shared = SharedParts(_tags(3), root=str(tmp_path))
    other = SharedParts.__new__(SharedParts)  # another worker's view of the same directory
    other.__setstate__(shared.__getstate__())
    fd = os.open(os.path.join(shared.path, "0.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "another worker" is decoding part 0
    calls: list[int] = []
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(shared.tables([0, 1, 2], _decoder(calls))))
    t.start()
    wait_until(lambda: len(calls) == 2, timeout=limit(60), what="parts 1 and 2 decoded")
    # it did what it could, and part 0 stays locked, so it can only be waiting for it
    assert t.is_alive() and calls == [1, 2]
    other._publish(0, pa.table({"v": pa.array([0] * 3, pa.int64())}))
    os.close(fd)  # the other worker is done
    t.join(timeout=limit(60))
    assert not t.is_alive() and calls == [1, 2]  # part 0 was mapped, never decoded here
    assert {p: got[p]["v"].to_pylist() for p in got} == {0: [0] * 3, 1: [1] * 3, 2: [2] * 3}
    shared.close()
    assert not os.path.exists(shared.path)


def test_a_published_file_serves_only_the_part_it_was_decoded_from(tmp_path):
    shared = SharedParts(_tags(2), root=str(tmp_path))
    shared._publish(0, pa.table({"v": pa.array([0] * 3, pa.int64())}))
    os.rename(os.path.join(shared.path, "0.arrow"), os.path.join(shared.path, "1.arrow"))
    with pytest.raises(SharedPartMismatch, match="expected part 1"):
        shared.tables([1], _decoder([]))
    short = SharedParts([{**t, "rows": 2} for t in _tags(1)], root=str(tmp_path))
    short._publish(0, pa.table({"v": pa.array([0] * 3, pa.int64())}))
    with pytest.raises(SharedPartMismatch, match="3 rows, part 0 has 2"):
        short.tables([0], _decoder([]))


def test_no_space_to_publish_falls_back_to_private_decoding(tmp_path, monkeypatch):
    shared = SharedParts(_tags(2), root=str(tmp_path))

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(partcache.ipc, "new_file", full)
    calls: list[int] = []
    got = shared.tables([0, 1], _decoder(calls))
    assert calls == [0, 1] and got[1]["v"].to_pylist() == [1] * 3
    assert shared.published() == [] and sorted(os.listdir(shared.path)) == ["0.lock"]


def test_the_shared_directory_goes_where_the_environment_says(index, tmp_path, monkeypatch):
    monkeypatch.setenv(partcache.ROOT_ENV, str(tmp_path / "parts"))
    loader = shared_parts_loader(index, transfer_batches=4)
    epoch_batches(loader, 0)
    path = Path(loader.dataset.shared.path)
    assert path.parent == tmp_path / "parts" and path.name.startswith(PREFIX)
    assert len(list(path.glob("*.arrow"))) == len(UNEVEN_SIZES)
