"""Resuming an epoch: stop after any k batches, restore the state, get exactly the rest.

The state goes through JSON as a checkpoint would hold it, and the resumed loader is a fresh one
(new worker processes), as after a restart. Checked against the uninterrupted epoch: nothing
delivered twice, nothing lost, and what was delivered before the stop is never read again.
"""

from __future__ import annotations

import json
import warnings

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.readers import (
    IdleOwnerWarning,
    Index,
    MapDataset,
    Owner,
    OwnerSampler,
    PartIterableDataset,
    ResumeMismatch,
    merge_states,
    set_epoch,
)
from tests.helpers.resume import EPOCH, ROW_GROUP, resume_index
from tests.helpers.resume import check_every_rank as _check_every_rank
from tests.helpers.resume import cut_and_reshape as _cut_and_reshape
from tests.helpers.resume import resume_loader as _loader
from tests.helpers.resume import shape_loader as _shape_loader
from tests.helpers.resume import stop_and_resume as _stop_and_resume


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    return resume_index(tmp_path_factory.mktemp("resume"))


# (workers, transfer_batches): in this process, and 2 workers sending 4 batches a message (a
# resume mid-message); more wirings are in tests/integration/test_loader_workers.py
WIRINGS = [(0, 1), (2, 4)]


@pytest.mark.parametrize("k", ["first", "middle", "last"])
@pytest.mark.parametrize(("workers", "transfer"), WIRINGS)
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_stop_after_k_batches_and_resume_exactly_once(index, style, workers, transfer, k):
    _check_every_rank(index, style, workers, transfer, k, world=2)


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_resume_on_three_ranks(index, style):
    """Other rank counts with workers: tests/integration/test_loader_workers.py."""
    _check_every_rank(index, style, 0, 1, "first", world=3)


def _strings(data) -> set[str]:
    """Every string in a JSON value, keys included (an id would be one of them, whole)."""
    if isinstance(data, str):
        return {data}
    if isinstance(data, dict):
        return set(data) | {s for v in data.values() for s in _strings(v)}
    if isinstance(data, list):
        return {s for v in data for s in _strings(v)}
    return set()


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_the_state_is_small_plain_data_without_ids(index, style):
    loader = _loader(index, style=style, num_workers=0, rank=0, world_size=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    text = json.dumps(state)
    assert json.loads(text) == state and len(text) < 400
    assert not _strings(state) & set(index.ids.to_pylist())  # offsets, not ids
    assert state["epoch"] == 0 and state["rank"] == 0 and state["world_size"] == 2
    assert (state["rows"] if style == "map" else sum(state["rows"])) == 3 * 16


def test_a_map_resume_fetches_only_what_was_not_delivered(index, tmp_path, monkeypatch):
    """Every position the resumed workers fetch is one the first run had not delivered."""
    log = tmp_path / "fetched.txt"
    real = MapDataset.take

    def logged(self, positions):
        with open(log, "a") as f:  # O_APPEND: whole lines from every forked worker
            f.write(" ".join(map(str, positions)) + "\n")
        return real(self, positions)

    monkeypatch.setattr(MapDataset, "take", logged)
    kw = dict(style="map", num_workers=2, transfer_batches=4, rank=1, world_size=2)
    head, tail, state = _stop_and_resume(index, 9, **kw)
    sampler = OwnerSampler(index, rank=1, world_size=2, seed=7)
    sampler.set_epoch(EPOCH)
    order = sampler.positions().tolist()
    assert state["rows"] == 9 * 16
    log.unlink()
    second = _loader(index, **kw)
    second.load_state_dict(state)
    fetched = [int(x) for x in log.read_text().split()] if log.exists() else []
    assert fetched == []  # nothing is read before iterating
    assert sum(len(b["item_id"]) for b in second) == len(order) - 9 * 16
    fetched = [int(x) for x in log.read_text().split()]
    assert sorted(fetched) == sorted(order[9 * 16 :])


def test_an_iterable_resume_skips_consumed_parts_and_row_groups(index, tmp_path, monkeypatch):
    """Resumed owners open no part they had finished and decode only row groups with rows left."""
    log = tmp_path / "read.txt"
    real_group, real_convert = pq.ParquetFile.read_row_group, PartIterableDataset._convert

    def read_group(self, i, *a, **kw):
        table = real_group(self, i, *a, **kw)
        with open(log, "a") as f:
            f.write("group " + " ".join(table.column("item_id").to_pylist()) + "\n")
        return table

    def convert(self, table):
        with open(log, "a") as f:
            f.write("yield " + " ".join(table.column("item_id").to_pylist()) + "\n")
        return real_convert(self, table)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_group)
    monkeypatch.setattr(PartIterableDataset, "_convert", convert)
    kw = dict(style="iterable", num_workers=2, transfer_batches=4, rank=0, world_size=2)
    head, tail, state = _stop_and_resume(index, 11, **kw)
    delivered = {x for b in head for x in b}
    log.unlink()
    second = _loader(index, **kw)
    second.load_state_dict(state)
    rest = {x for b in second for x in b["item_id"]}
    groups = [ln.split()[1:] for ln in log.read_text().splitlines() if ln.startswith("group")]
    yielded = [
        x for ln in log.read_text().splitlines() if ln.startswith("yield") for x in ln.split()[1:]
    ]
    assert sorted(yielded) == sorted(rest) and not delivered & set(yielded)  # nothing twice
    for g in groups:  # a row group decoded again holds at least one row not yet delivered
        assert set(g) - delivered, "a fully consumed row group was read again"
    assert sum(len(g) for g in groups) < len(rest) + 2 * ROW_GROUP  # at most one per owner


def test_resuming_past_the_last_batch_yields_nothing_then_the_next_epoch(index):
    loader = _loader(index, style="iterable", num_workers=0, rank=0, world_size=1)
    set_epoch(loader, EPOCH)
    n = sum(1 for _ in loader)
    state = loader.state_dict()
    again = _loader(index, style="iterable", num_workers=0, rank=0, world_size=1)
    again.load_state_dict(state)
    assert list(again) == []
    set_epoch(again, EPOCH + 1)  # a finished epoch's state gives way to the next epoch
    assert sum(1 for _ in again) == n


def test_set_epoch_refuses_to_skip_the_rest_of_a_loaded_epoch(index):
    loader = _loader(index, style="map", num_workers=0, rank=0, world_size=1)
    set_epoch(loader, EPOCH)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = _loader(index, style="map", num_workers=0, rank=0, world_size=1)
    again.load_state_dict(state)
    with pytest.raises(ValueError, match=f"resumes epoch {EPOCH} with 993 row"):
        set_epoch(again, EPOCH + 1)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(seed=8), "seed"),
        (dict(rank=1), "rank"),
        (dict(world_size=3, rank=0), "world_size"),
        (dict(shuffle=False), "shuffle"),
        (dict(style="map"), "style"),
        (dict(num_workers=1), "num_workers"),
    ],
)
def test_a_state_from_another_loader_is_refused(index, change, field):
    kw = dict(style="iterable", num_workers=2, rank=0, world_size=2)
    state = _loader(index, **kw).state_dict()
    with pytest.raises(ResumeMismatch, match=field):
        _loader(index, **{**kw, **change}).load_state_dict(state)


def test_a_map_state_survives_a_new_worker_count_and_batch_size(index):
    """Map-style ownership does not depend on workers; a new batch size only moves the cuts."""
    kw = dict(style="map", rank=0, world_size=2)
    first = _loader(index, num_workers=0, **kw)
    it = iter(first)
    head = [x for _ in range(5) for x in next(it)["item_id"]]
    second = _loader(index, num_workers=2, batch_size=40, **kw)
    second.load_state_dict(first.state_dict())
    tail = [x for b in second for x in b["item_id"]]
    whole = [x for b in _loader(index, num_workers=0, **kw) for x in b["item_id"]]
    assert head + tail == whole


def test_a_state_that_does_not_fit_is_refused(index):
    loader = _loader(index, style="map", num_workers=0, rank=0, world_size=2)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="does not fit"):
        loader.load_state_dict({**state, "rows": 505})  # rank 0 holds 504
    with pytest.raises(ResumeMismatch, match="version"):
        loader.load_state_dict({**state, "version": 99})


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_state_in_the_version_1_layout_loads_and_resumes(index, style):
    """The saved layout is a contract: states written by earlier releases must keep loading."""
    ident = index.snapshot.identity
    saved = {
        "version": 1,
        "style": style,
        "rank": 1,
        "world_size": 2,
        "shuffle": True,
        "seed": 7,
        "items": 1009,
        "snapshot": f"{ident.version_id}:{ident.content_sha256}",
        **({"num_workers": 1} if style == "iterable" else {}),
        "epoch": EPOCH,
        "batch_size": 16,
        "rows": 40 if style == "map" else [40],
    }
    kw = dict(style=style, num_workers=0, rank=1, world_size=2)
    whole = _loader(index, **kw)
    set_epoch(whole, EPOCH)
    full = [x for b in whole for x in b["item_id"]]
    loader = _loader(index, **kw)
    loader.load_state_dict(json.loads(json.dumps(saved)))
    # read back unchanged, in today's layout: version 2, no mixing, no earlier legs
    assert loader.state_dict() == {**saved, "version": 2, "mix": False, "legs": []}
    assert index.ids.take(loader.delivered_positions()).to_pylist() == full[:40]
    set_epoch(loader, EPOCH)
    assert [x for b in loader for x in b["item_id"]] == full[40:]


# -- the readers' own state, torchdata-style --------------------------------------------------


def test_owner_sampler_state_counts_what_it_yielded(index):
    s = OwnerSampler(index, rank=1, world_size=2, seed=3)
    s.set_epoch(2)
    order = s.positions().tolist()
    it = iter(s)
    got = [next(it) for _ in range(10)]
    assert s.state_dict() == {"epoch": 2, "yielded": 10}
    fresh = OwnerSampler(index, rank=1, world_size=2, seed=3)
    fresh.load_state_dict(s.state_dict())
    assert got + list(fresh) == order
    assert list(fresh) == order  # the resume point is used once


combos = dict(
    world=st.integers(1, 4),
    workers=st.integers(0, 3),
    batch=st.integers(1, 200),
    seed=st.integers(0, 2**31),
    shuffle=st.booleans(),
    cut=st.floats(0, 1),
)


@settings(
    max_examples=min(60, settings().max_examples),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(**combos)
def test_every_owner_resumes_its_stream_at_any_row(
    index, world, workers, batch, seed, shuffle, cut
):
    """Any owner, any resume row (not only batch boundaries): the rest of its stream, in order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IdleOwnerWarning)
        for rank in range(world):
            ds = PartIterableDataset(
                index, batch_size=batch, shuffle=shuffle, seed=seed, rank=rank, world_size=world
            )
            ds.set_epoch(1)
            owners = [Owner(rank, world, w, workers) for w in range(max(workers, 1))]
            streams = [[x for b in ds.iter_owner(o) for x in b["item_id"]] for o in owners]
            for o, stream in zip(owners, streams, strict=True):  # the order, from metadata only
                assert index.ids.take(ds.stream_positions(o)).to_pylist() == stream
            rows = [int(cut * len(s)) for s in streams]
            ds.load_state_dict({"epoch": 1, "rows": rows})
            for o, s, r in zip(owners, streams, rows, strict=True):
                rest = list(ds.iter_owner(o))
                assert [x for b in rest for x in b["item_id"]] == s[r:]
                # cuts stay on the owner's batch grid: only the first batch may be short
                assert all(len(b["item_id"]) == batch for b in rest[1:-1])
                if rest and r % batch == 0:
                    assert len(rest[0]["item_id"]) == min(batch, len(s) - r)
            assert ds.state_dict() == {"epoch": 1, "rows": [len(s) for s in streams]}


def test_the_iterable_dataset_refuses_a_dataloader_with_another_worker_count(index):
    ds = PartIterableDataset(index, batch_size=8, rank=0, world_size=1, num_workers=2)
    with pytest.raises(ValueError, match="num_workers=2"):
        next(iter(ds))  # iterated in the main process: 1 owner, not the 2 it was built for
    assert len(ds) == sum(-(-r // 8) for r in ds.owner_rows())


# -- resuming at another shape ----------------------------------------------------------------

RANKS = [1, 2, 3]
SHAPES = [(r, w) for r in RANKS for w in (0, 1, 2, 3)]


def _exactly_once(index, head, tail):
    assert len(head) + len(tail) == len(index)  # none twice (with the next line), none lost
    assert sorted(head + tail) == index.ids.to_pylist()


@pytest.mark.exhaustive
@pytest.mark.filterwarnings("ignore::pipeline.readers.IdleOwnerWarning")
@pytest.mark.parametrize("k", ["first", "middle", "last"])
@pytest.mark.parametrize("after", SHAPES, ids=lambda s: f"to{s[0]}x{s[1]}")
@pytest.mark.parametrize("before", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_an_iterable_epoch_resumes_exactly_once_at_any_shape(index, before, after, k):
    head, tail, merged = _cut_and_reshape(index, "iterable", before, after, k)
    _exactly_once(index, head, tail)
    assert len(json.dumps(merged)) < 600  # a few ints per owner, no ids


@pytest.mark.parametrize("k", ["first", "middle", "last"])
@pytest.mark.parametrize("after", RANKS, ids=lambda r: f"to{r}")
@pytest.mark.parametrize("before", RANKS, ids=str)
def test_a_map_epoch_resumes_exactly_once_on_any_number_of_ranks(index, before, after, k):
    """Map-style ownership is per rank (its workers fetch what the sampler hands out), so the
    ranks are the shape; a new worker count is shown above to change nothing."""
    head, tail, merged = _cut_and_reshape(index, "map", (before, 0), (after, 0), k)
    _exactly_once(index, head, tail)
    assert len(json.dumps(merged)) < 400


def test_an_epoch_resumed_twice_at_new_shapes_is_still_read_once(index):
    """A merged state carries its legs: cut at 2 ranks, resume at 3, cut again, resume at 1."""
    for style, shapes in (
        ("map", [(2, 0), (3, 0), (1, 0)]),
        ("iterable", [(2, 3), (3, 2), (1, 0)]),
    ):
        states, head = [], []
        for rank in range(shapes[0][0]):
            loader = _shape_loader(index, style, rank, *shapes[0])
            set_epoch(loader, EPOCH)
            it = iter(loader)
            head += [x for _ in range(3) for x in next(it)["item_id"]]
            states.append(loader.state_dict())
        merged = merge_states(states)
        states = []
        for rank in range(shapes[1][0]):
            loader = _shape_loader(index, style, rank, *shapes[1])
            loader.load_state_dict(merged)
            it = iter(loader)
            head += [x for _ in range(2) for x in next(it)["item_id"]]
            states.append(loader.state_dict())
        merged = merge_states(states)
        assert len(merged["legs"]) == 2
        loader = _shape_loader(index, style, 0, *shapes[2])
        loader.load_state_dict(merged)
        assert sorted(index.ids.take(loader.delivered_positions()).to_pylist()) == sorted(head)
        _exactly_once(index, head, [x for b in loader for x in b["item_id"]])


def test_one_ranks_state_at_another_shape_is_refused_and_says_how(index):
    state = _loader(index, style="map", num_workers=0, rank=0, world_size=2).state_dict()
    other = _loader(index, style="map", num_workers=0, rank=0, world_size=3)
    with pytest.raises(ResumeMismatch, match="merge every rank's state with merge_states"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "field"), [(dict(seed=8), "seed"), (dict(shuffle=False), "shuffle")]
)
def test_a_merged_state_of_another_split_is_refused(index, change, field):
    kw = dict(style="iterable", num_workers=0, world_size=2)
    merged = merge_states([_loader(index, rank=r, **kw).state_dict() for r in range(2)])
    with pytest.raises(ResumeMismatch, match=field):
        _loader(index, **{**kw, **change, "rank": 0}).load_state_dict(merged)
    with pytest.raises(ResumeMismatch, match="snapshot"):
        _loader(index, **{**kw, "rank": 0}).load_state_dict({**merged, "snapshot": "x:y"})


def test_merge_states_needs_every_rank_of_one_step(index):
    kw = dict(style="map", num_workers=0, world_size=2)
    loaders = [_loader(index, rank=r, **kw) for r in range(2)]
    it = iter(loaders[0])
    next(it)
    states = [lo.state_dict() for lo in loaders]
    with pytest.raises(ResumeMismatch, match="got ranks \\[0\\]"):
        merge_states(states[:1])
    with pytest.raises(ResumeMismatch, match="got ranks \\[0, 0\\]"):
        merge_states([states[0], states[0]])
    with pytest.raises(ResumeMismatch, match="epoch"):
        merge_states([states[0], {**states[1], "epoch": 9}])
    with pytest.raises(ResumeMismatch, match="not merged states"):
        merge_states([merge_states(states)])
