"""Map-style and iterable readers: exactly-once, ids and types intact, refusals loud."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import IncompleteBundle, NotVerified
from pipeline.bundle.verify import verify
from pipeline.readers import (
    IdleOwnerWarning,
    MapDataset,
    Owner,
    OwnerSampler,
    PartIterableDataset,
    accepted_mask,
    accepted_only,
    collate_batches,
    confidence_weights,
    make_loader,
    set_epoch,
)
from pipeline.readers.index import Index
from tests.helpers.bundles import make_bundle
from tests.helpers.readers import dealt_to_workers


@pytest.fixture(scope="module")
def all_ids(index) -> list[str]:
    return index.ids.to_pylist()


def _map_ids(index, world, workers, batch, seed, epoch, shuffle=True) -> list[str]:
    ds = MapDataset(index, columns=["label"])
    out: list[str] = []
    for r in range(world):
        sampler = OwnerSampler(index, rank=r, world_size=world, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        for dealt in dealt_to_workers(sampler, batch, workers):
            out.extend(x for b in dealt for x in ds.__getitems__(b)["item_id"])
    return out


def _iter_ids(index, world, workers, batch, seed, epoch, shuffle) -> tuple[list[str], list]:
    out: list[str] = []
    sizes = []
    for r in range(world):
        ds = PartIterableDataset(
            index, batch_size=batch, shuffle=shuffle, seed=seed, rank=r, world_size=world
        )
        ds.set_epoch(epoch)
        for w in range(max(workers, 1)):
            owner = Owner(r, world, w, workers)
            batches = list(ds.iter_owner(owner))
            sizes.append([len(b["item_id"]) for b in batches])
            got = [x for b in batches for x in b["item_id"]]
            # whole parts: an owner's ids are exactly the union of its parts' ids
            want = sorted(
                x
                for p in ds.parts_for(owner)
                for x in index.ids[index.part_offsets[p] : index.part_offsets[p + 1]].to_pylist()
            )
            assert sorted(got) == want
            out.extend(got)
    return out, sizes


combos = dict(
    world=st.integers(1, 6),
    workers=st.integers(0, 4),
    batch=st.integers(1, 300),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 50),
)


@settings(
    max_examples=min(40, settings().max_examples),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(**combos)
def test_map_style_exactly_once_over_owners(index, all_ids, world, workers, batch, seed, epoch):
    got = _map_ids(index, world, workers, batch, seed, epoch)
    assert len(got) == len(all_ids)
    assert sorted(got) == sorted(all_ids)


@settings(
    max_examples=min(40, settings().max_examples),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(**combos, shuffle=st.booleans())
def test_iterable_whole_parts_exactly_once(
    index, all_ids, world, workers, batch, seed, epoch, shuffle
):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IdleOwnerWarning)  # 7 parts, up to 24 owners
        got, sizes = _iter_ids(index, world, workers, batch, seed, epoch, shuffle)
    assert len(got) == len(all_ids)
    assert sorted(got) == sorted(all_ids)
    for s in sizes:  # every batch is full except an owner's last
        assert all(n == batch for n in s[:-1]) and (not s or 1 <= s[-1] <= batch)


def test_shuffle_orders_but_never_changes_the_share(index):
    def epoch_ids(epoch, rank, seed=5):
        s = OwnerSampler(index, rank=rank, world_size=2, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    a, b = epoch_ids(0, 0), epoch_ids(1, 0)
    assert a != b and sorted(a) == sorted(b)
    # two ranks with the same seed still read disjoint items
    assert not set(epoch_ids(0, 0)) & set(epoch_ids(0, 1))
    assert len(OwnerSampler(index, rank=0, world_size=2)) == 504
    assert len(OwnerSampler(index, rank=1, world_size=2)) == 505


def test_ids_stay_strings_with_leading_zeros(index):
    ds = MapDataset(index)
    batch = ds.__getitems__([0, 5, 42, 1008])
    assert batch["item_id"] == ["00000", "00005", "00042", "01008"]
    assert all(type(x) is str for x in batch["item_id"])
    assert ds[42]["item_id"] == "00042"
    it = next(iter(PartIterableDataset(index, batch_size=4)))
    assert it["item_id"] == ["00000", "00001", "00002", "00003"]


def test_getitems_keeps_the_requested_order_across_parts(index):
    ds = MapDataset(index)
    pos = [1008, 0, 500, 1, 999, 302]
    batch = ds.__getitems__(pos)
    assert batch["item_id"] == [f"{p:05d}" for p in pos]
    # feature rows follow their ids: x[k] = 10 * id + k
    want = torch.tensor([[10.0 * p + k for k in range(4)] for p in pos])
    assert torch.equal(batch["x"], want)
    assert batch["label"].tolist() == [p % 7 for p in pos]


def test_batches_have_declared_dtypes_and_lithi_columns_always(index):
    ds = MapDataset(index, columns=["x"])
    assert ds.columns == ["item_id", "x", *fmt.RESULT_COLUMNS]
    b = ds.__getitems__(list(range(8)))
    assert b["x"].dtype == torch.float32 and b["x"].shape == (8, 4)
    assert isinstance(b["lithi_status"], list) and isinstance(b["lithi_verification"], list)
    assert b["lithi_confidence"].dtype == torch.float32
    assert "label" not in b
    it = next(iter(PartIterableDataset(index, batch_size=8, columns=["label"])))
    assert set(it) >= {"item_id", "label", *fmt.RESULT_COLUMNS} and "x" not in it
    assert it["label"].dtype == torch.int64


def test_failed_rows_have_null_confidence_as_nan_and_zero_weight(index):
    b = MapDataset(index).__getitems__(list(range(12)))
    failed = [i for i, s in enumerate(b["lithi_status"]) if s == "failed"]
    assert failed and all(torch.isnan(b["lithi_confidence"][i]) for i in failed)
    assert not b["lithi_confidence__valid"][failed].any()
    w = confidence_weights(b)
    assert w.dtype == torch.float32 and (w[failed] == 0).all()
    ok = [i for i in range(12) if i not in failed]
    assert torch.equal(w[ok], b["lithi_confidence"][ok])


def test_accepted_only_filters_every_column_alike(index):
    b = MapDataset(index).__getitems__(list(range(20)))
    a = accepted_only(b)
    assert set(a["lithi_status"]) == {"accepted"}
    assert len(a["item_id"]) == a["x"].shape[0] == a["label"].shape[0] == 10
    for i, id_ in enumerate(a["item_id"]):
        assert a["x"][i, 0].item() == 10 * int(id_)


@pytest.mark.parametrize("form", ["list", "numpy", "arrow"])
def test_accepted_mask_reads_nulls_and_other_values_as_not_accepted(form):
    status = ["accepted", None, "failed", "accepted", "abstained", "Accepted", ""]
    value = {"list": status, "numpy": np.array(status, dtype=object)}.get(form)
    mask = accepted_mask({"lithi_status": pa.array(status) if value is None else value})
    assert mask.dtype == torch.bool
    assert mask.tolist() == [True, False, False, True, False, False, False]


def test_collate_batches_passes_batches_and_stacks_rows(index):
    ds = MapDataset(index)
    built = ds.__getitems__([1, 2])
    assert collate_batches(built) is built
    rows = collate_batches([ds[1], ds[2]])
    assert rows["item_id"] == ["00001", "00002"]
    assert torch.equal(rows["x"], built["x"]) and rows["label"].tolist() == [1, 2]
    with pytest.raises(TypeError):
        collate_batches([1, 2])


def test_per_row_loader_without_getitems_matches(index):
    class PerRow(MapDataset):
        __getitems__ = None  # torch's fetcher then calls __getitem__ once per row

    ds = PerRow(index)
    loader = DataLoader(ds, batch_size=5, collate_fn=collate_batches)
    first = next(iter(loader))
    assert first["item_id"] == ["00000", "00001", "00002", "00003", "00004"]
    assert first["x"].shape == (5, 4)


def test_idle_owner_warns_naming_the_numbers(index):
    ds = PartIterableDataset(index, batch_size=10, rank=0, world_size=1)
    with pytest.warns(IdleOwnerWarning, match=r"7 part\(s\) for 9 owners"):
        assert list(ds.iter_owner(Owner(0, 1, 8, 9))) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdleOwnerWarning)
        assert list(ds.iter_owner(Owner(0, 1, 8, 9))) == []  # said once, not every time


def test_readers_refuse_unverified_inputs(index, tmp_path):
    root = index.snapshot.root
    for bad in (root, str(root), index.manifest):
        with pytest.raises(NotVerified, match="VerifiedSnapshot"):
            MapDataset(bad)
        with pytest.raises(NotVerified, match="verify"):
            PartIterableDataset(bad, batch_size=4)
        with pytest.raises(NotVerified):
            Index.from_snapshot(bad)
    with pytest.raises(NotVerified, match="Manifest alone"):
        Index.from_snapshot(index.manifest)


def test_bundle_without_manifest_cannot_be_read(tmp_path):
    snap = make_bundle(tmp_path, [3, 4])
    (snap.root / fmt.MANIFEST_NAME).unlink()
    with pytest.raises(IncompleteBundle, match="no result-manifest.json"):
        verify(snap.root)
    with pytest.raises(NotVerified):
        MapDataset(snap.root)


def test_a_verified_snapshot_is_accepted_directly(index):
    ds = MapDataset(index.snapshot)
    assert len(ds) == 1009
    assert np.array_equal(ds.index.part_offsets, index.part_offsets)


def test_the_docs_say_what_the_batched_transfer_changes():
    from pathlib import Path

    text = " ".join((Path(__file__).parents[2] / "docs" / "readers.md").read_text().split())
    assert "batches, order and ownership are unchanged" not in text
    assert "arrive `k` at a time from each worker" in text
    assert "the map-style order is unchanged" in text


def test_default_transfer_batches_follows_the_worker_count(index):
    from pipeline.readers.loader import TRANSFER_ROWS, ReaderLoader

    fast = make_loader(index, batch_size=64, num_workers=2)
    assert isinstance(fast, ReaderLoader) and fast.loader.batch_size == TRANSFER_ROWS
    assert fast.transfer_batches == TRANSFER_ROWS // 64
    for plain in (
        make_loader(index, batch_size=64, num_workers=0),
        make_loader(index, batch_size=64, num_workers=2, drop_last=True),
    ):
        assert isinstance(plain, ReaderLoader) and plain.loader.batch_size == 64
        assert plain.transfer_batches == 1
    with pytest.raises(ValueError, match="drop_last"):
        make_loader(index, num_workers=2, drop_last=True, transfer_batches=4)


# -- balanced ranks on the iterable path ------------------------------------------------------


def test_iterable_ranks_read_even_rows_from_equal_parts(tmp_path):
    """8 equal parts on 2 ranks x 3 workers: 400 rows per rank (rank-major owners gave 500/300)."""
    eight = Index.from_snapshot(make_bundle(tmp_path, [100] * 8))
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdleOwnerWarning)  # 4 parts per rank: no worker idles
        for r in range(2):
            ds = PartIterableDataset(eight, batch_size=64, rank=r, world_size=2)
            got = [
                x for w in range(3) for b in ds.iter_owner(Owner(r, 2, w, 3)) for x in b["item_id"]
            ]
            rows.append(len(got))
    assert rows == [400, 400]
    declared = PartIterableDataset(eight, batch_size=64, rank=1, world_size=2, num_workers=3)
    assert declared.owner_rows() == [200, 100, 100]


# -- per-row samples ----------------------------------------------------------------------------


class PerRow(MapDataset):
    __getitems__ = None  # torch's fetcher then calls __getitem__ once per row


def test_a_one_row_batch_of_samples_stays_a_batch(index):
    ds = MapDataset(index)
    one = collate_batches([ds[42]])
    assert one["item_id"] == ["00042"] and one["x"].shape == (1, 4)
    assert one["label"].shape == (1,) and one["lithi_confidence__valid"].shape == (1,)
    assert one["lithi_status"] == [ds[42]["lithi_status"]]


def test_per_row_samples_through_concat_dataset_tally_every_id_once(index):
    """1,009 rows in batches of 6 end in a 1-row batch, whose id was once counted by character."""
    from torch.utils.data import ConcatDataset

    from pipeline.readers import Tally, reconcile

    ds = ConcatDataset([PerRow(index)])  # no __getitems__: torch fetches row by row
    tally = Tally(index.id_field)
    batches = list(DataLoader(ds, batch_size=6, collate_fn=collate_batches))
    assert batches[-1]["item_id"] == ["01008"] and batches[-1]["x"].shape == (1, 4)
    for b in batches:
        tally.update(b)
    report = reconcile(index.manifest, [tally.counts], ids=index.ids)
    assert report.ok and report.items_iterated == 1009


def test_tally_refuses_a_sample_instead_of_counting_characters(index):
    from pipeline.readers import Tally

    with pytest.raises(TypeError, match="per-row sample"):
        Tally(index.id_field).update(MapDataset(index)[42])


# -- len() on every loader ----------------------------------------------------------------------


@pytest.mark.parametrize("style", ["map", "iterable"])
@pytest.mark.parametrize(("workers", "transfer"), [(0, None), (2, None), (2, 1), (2, 3)])
def test_len_of_every_loader_is_its_batch_count(index, style, workers, transfer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IdleOwnerWarning)
        loader = make_loader(
            index,
            style=style,
            batch_size=32,
            num_workers=workers,
            rank=1,
            world_size=2,
            transfer_batches=transfer,
            persistent_workers=False,
        )
        assert len(loader) == sum(1 for _ in loader)
    if style == "map":
        dropped = make_loader(
            index, batch_size=32, num_workers=0, drop_last=True, rank=1, world_size=2
        )
        assert len(dropped) == 505 // 32 == sum(1 for _ in dropped)


# -- the rank the readers resolve ------------------------------------------------------------


def test_falling_back_to_rank_0_of_1_warns_when_world_size_says_otherwise(index, monkeypatch):
    from pipeline.readers import NoProcessGroupWarning

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.warns(NoProcessGroupWarning, match="WORLD_SIZE=2"):
        assert OwnerSampler(index).world_size == 1
    with pytest.warns(NoProcessGroupWarning, match="init_process_group"):
        PartIterableDataset(index, batch_size=8)
    with pytest.warns(NoProcessGroupWarning):
        make_loader(index, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoProcessGroupWarning)
        OwnerSampler(index, rank=1, world_size=2)  # explicit coordinates are a decision
        OwnerSampler(index, rank=0, world_size=1)
        monkeypatch.setenv("WORLD_SIZE", "1")
        OwnerSampler(index)


# -- the idle-owner warning ---------------------------------------------------------------------


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_the_worker_pipe_holds_a_whole_message(index, style, monkeypatch):
    import fcntl

    from pipeline.readers import _worker

    sizes: list[int] = []
    real = _worker._widen_result_pipe

    def widen(iterator):
        real(iterator)
        sizes.append(fcntl.fcntl(iterator._worker_result_queue._reader.fileno(), 1032))

    monkeypatch.setattr(_worker, "_widen_result_pipe", widen)
    loader = make_loader(index, style=style, batch_size=16, num_workers=2)
    assert sum(len(b["item_id"]) for b in loader) == len(index)
    assert sizes and all(s >= _worker._pipe_bytes() for s in sizes)  # F_GETPIPE_SZ


def test_a_pipe_that_cannot_be_widened_changes_nothing_but_speed(index, monkeypatch):
    import fcntl

    def refuse(fd, cmd, *arg):
        raise PermissionError("pipe-user-pages-soft reached")

    monkeypatch.setattr(fcntl, "fcntl", refuse)
    loader = make_loader(index, style="map", batch_size=16, num_workers=2)
    assert sorted(x for b in loader for x in b["item_id"]) == sorted(index.ids.to_pylist())


def _record_pool(log: str, worker_id: int) -> None:
    import pyarrow as pa

    with open(log, "a") as f:  # O_APPEND: one whole line per worker
        f.write(f"{worker_id} {pa.default_memory_pool().backend_name}\n")


def _pools(log) -> list[str]:
    return sorted(log.read_text().splitlines())


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_workers_decode_into_the_worker_pool_and_still_run_the_users_init(
    index, tmp_path, monkeypatch, style
):
    import functools

    import pyarrow as pa

    from pipeline.readers._worker import WORKER_POOL

    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    try:
        getattr(pa, f"{WORKER_POOL}_memory_pool")()
        want = WORKER_POOL
    except NotImplementedError:  # a pyarrow built without it keeps its default
        want = pa.default_memory_pool().backend_name
    log = tmp_path / "pools.txt"
    init = functools.partial(_record_pool, str(log))
    # not persistent: the epoch's end then waits for every worker, so each has run its init
    # even where one message held the whole epoch and a worker started late on a busy machine
    loader = make_loader(
        index,
        style=style,
        batch_size=16,
        num_workers=2,
        worker_init_fn=init,
        persistent_workers=False,
    )
    assert sorted(x for b in loader for x in b["item_id"]) == sorted(index.ids.to_pylist())
    assert _pools(log) == [f"0 {want}", f"1 {want}"]


def test_a_pool_the_user_chose_is_kept_in_the_workers(index, tmp_path, monkeypatch):
    import functools

    import pyarrow as pa

    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
    parent = pa.default_memory_pool().backend_name  # chosen when Arrow started in this process
    log = tmp_path / "pools.txt"
    init = functools.partial(_record_pool, str(log))
    kw = dict(batch_size=16, num_workers=2, worker_init_fn=init, persistent_workers=False)
    list(make_loader(index, style="map", **kw))  # not persistent: see the test above
    assert _pools(log) == [f"0 {parent}", f"1 {parent}"]


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_new_batch_size_cuts_the_same_rows_into_larger_batches(index, style):
    loader = make_loader(index, style=style, batch_size=16, num_workers=1, seed=3)
    assert loader.message_rows == 16 * loader.transfer_batches
    set_epoch(loader, 2)
    small = [b for b in loader]
    loader.set_batch_size(loader.message_rows)
    set_epoch(loader, 2)
    large = [b for b in loader]
    assert len(large) < len(small) and max(len(b[index.id_field]) for b in large) > 16
    key = index.id_field
    assert [i for b in large for i in b[key]] == [i for b in small for i in b[key]]
    assert len(loader) == len(large)
    with pytest.raises(ValueError, match="worker message"):
        loader.set_batch_size(loader.message_rows + 1)
