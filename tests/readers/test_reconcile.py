"""Reconciliation: owners' counts must sum to the manifest's, every id exactly once."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch.distributed as dist
from torch.utils.data import BatchSampler

from pipeline.bundle.errors import BundleError
from pipeline.readers import POSITION_KEY, MapDataset, OwnerSampler, accepted_only
from pipeline.readers.index import Index
from pipeline.readers.reconcile import (
    OwnerCounts,
    ReconcileError,
    Tally,
    keyed_coverage,
    reconcile,
    reconcile_distributed,
)
from tests.helpers.bundles import make_bundle

SIZES = [7, 3, 10]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    return Index.from_snapshot(make_bundle(tmp_path_factory.mktemp("rc"), SIZES))


BY = ["positions", "ids"]  # a reader's batches; batches built by hand, without positions


def _tallies(index, world, positions_fn=None, by="positions") -> list[OwnerCounts]:
    ds = MapDataset(index)
    out = []
    for r in range(world):
        tally = Tally(index.id_field, label=f"rank{r}")
        sampler = OwnerSampler(index, rank=r, world_size=world, seed=1)
        for b in BatchSampler(sampler, 4, drop_last=False):
            batch = ds.__getitems__(positions_fn(b) if positions_fn else b)
            if by == "ids":
                del batch[POSITION_KEY]
            tally.update(batch)
            accepted_only(batch)  # filtering after counting leaves the tally whole
        out.append(tally.counts)
    return out


@pytest.mark.parametrize("by", BY)
def test_complete_iteration_reconciles(index, by):
    counts = _tallies(index, 3, by=by)
    assert sum(c.rows for c in counts) == 20
    assert all(bool(c.position_chunks) == (by == "positions") for c in counts)
    assert all(bool(c.id_chunks) == (by == "ids") for c in counts)
    report = reconcile(index.manifest, counts, ids=index.ids)
    assert report.ok and report.problems() == []
    assert report.items_expected == report.items_iterated == 20
    assert report.by_status_found == report.by_status_expected == index.manifest.counts.by_status
    assert report.by_status_found == {"accepted": 10, "failed": 5, "abstained": 5}
    assert report.duplicates == 0 and report.missing == 0 and report.owners == 3
    assert report.as_dict()["ok"] is True


@pytest.mark.parametrize("by", BY)
def test_a_duplicate_is_an_error_naming_it(index, by):
    counts = _tallies(index, 2, by=by)
    # rank 1 also yields rank 0's first chunk again
    if by == "ids":
        again = counts[0].id_chunks[0]
        counts[1] = OwnerCounts(counts[1].by_status, [*counts[1].id_chunks, again])
        named = again.to_pylist()
    else:
        again = counts[0].position_chunks[0]
        counts[1].position_chunks.append(again)
        named = index.ids.take(pa.array(again)).to_pylist()
    with pytest.raises(ReconcileError, match="more than once") as e:
        reconcile(index.manifest, counts, ids=index.ids)
    assert isinstance(e.value, BundleError)
    assert e.value.report.duplicates == 4 and "over by 4" in str(e.value)
    assert e.value.report.duplicate_examples == sorted(named)


@pytest.mark.parametrize("by", BY)
def test_a_missing_rank_is_a_shortfall(index, by):
    counts = _tallies(index, 2, by=by)[:1]
    with pytest.raises(ReconcileError, match="short by 10") as e:
        reconcile(index.manifest, counts, ids=index.ids)
    report = e.value.report
    assert report.missing == 10 and len(report.missing_examples) == 5
    assert set(report.missing_examples) <= set(index.ids.to_pylist())
    report = reconcile(index.manifest, counts, raise_on_mismatch=False)
    # without the index's ids: positions still count the missing, ids alone cannot
    assert not report.ok and report.missing == (10 if by == "positions" else None)


def test_a_position_outside_the_index_is_a_row_too_many(index):
    counts = _tallies(index, 1)
    counts[0].position_chunks.append(np.array([20], dtype=np.int64))
    with pytest.raises(ReconcileError, match="over by 1"):
        reconcile(index.manifest, counts, ids=index.ids)


def test_owners_tallied_by_ids_and_by_positions_reconcile_together(index):
    counts = [*_tallies(index, 2, by="ids")[:1], *_tallies(index, 2)[1:]]
    assert reconcile(index.manifest, counts, ids=index.ids).ok
    with pytest.raises(ValueError, match="needs the index's ids"):
        reconcile(index.manifest, counts)


def test_a_batch_whose_positions_name_other_rows_is_refused(index):
    batch = MapDataset(index).__getitems__([3, 4, 5])
    batch[POSITION_KEY] = batch[POSITION_KEY] + 1
    Tally(index.id_field).update(dict(batch))  # without the index's ids nothing is checked
    with pytest.raises(ValueError, match="index position 4 for id"):
        Tally(index.id_field, index_ids=index.ids).update(batch)


def test_status_counts_must_match_too(index):
    counts = _tallies(index, 1)
    counts[0].by_status["accepted"] -= 1
    counts[0].by_status["failed"] += 1
    with pytest.raises(ReconcileError, match="accepted: expected 10"):
        reconcile(index.manifest, counts)


@pytest.mark.parametrize("by", BY)
def test_swapped_ids_with_right_totals_are_caught(index, by):
    # the same position twice and one never: totals match, ids do not
    counts = _tallies(index, 1, positions_fn=lambda b: [b[0]] * len(b), by=by)
    with pytest.raises(ReconcileError, match="more than once"):
        reconcile(index.manifest, counts)


@pytest.mark.parametrize("by", BY)
def test_owner_counts_pickle_compactly(index, by):
    counts = _tallies(index, 2, by=by)
    back = pickle.loads(pickle.dumps(counts[0]))
    assert back.ids().to_pylist() == counts[0].ids().to_pylist()
    assert np.array_equal(back.positions(), counts[0].positions())
    assert len(back.id_chunks) == (by == "ids") and back.by_status == counts[0].by_status
    assert len(back.position_chunks) == (by == "positions")
    assert back.ids().type == pa.string() and back.rows == counts[0].rows == 10


def test_reconcile_distributed_single_rank_group(index, tmp_path):
    counts = _tallies(index, 1)[0]
    assert reconcile_distributed(index.manifest, counts).ok  # no group: local reconcile
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        assert reconcile_distributed(index.manifest, counts).ok
        with pytest.raises(ReconcileError):
            reconcile_distributed(index.manifest, OwnerCounts())
    finally:
        dist.destroy_process_group()


def test_keyed_coverage_names_missing_extra_and_repeated_ids():
    index_ids = pa.array(["00001", "00002", "00003", "00004"])
    exact = keyed_coverage(index_ids, pa.chunked_array([["00003", "00001"], ["00004", "00002"]]))
    assert exact.ok and exact.problems() == [] and (exact.rows, exact.items) == (4, 4)
    off = keyed_coverage(index_ids, pa.array(["00001", "00001", "00002", "99999"]))
    assert not off.ok
    assert (off.missing, off.missing_examples) == (2, ["00003", "00004"])
    assert (off.extra, off.extra_examples) == (1, ["99999"])
    assert (off.duplicates, off.duplicate_examples) == (1, ["00001"])
    assert len(off.problems()) == 3 and "99999" in off.problems()[1]


@pytest.mark.parametrize("as_arrow", [False, True])
def test_a_tally_counts_every_status_it_meets_nulls_and_strangers_included(as_arrow):
    # statuses as the readers hand them over (a list of strings) or as Arrow: the same counts,
    # and a value a valid bundle never holds is counted under its own name, not dropped
    status = ["accepted", "failed", None, "accepted", "pending", "abstained", "accepted"]
    tally = Tally("id")
    batch = {"id": [f"i{k}" for k in range(len(status))], "lithi_status": status}
    if as_arrow:
        batch["lithi_status"] = pa.array(status, pa.string())
    tally.update(batch)
    tally.update({"id": ["j"], "lithi_status": ["failed"]})
    assert tally.counts.by_status == {
        "accepted": 3, "failed": 2, "abstained": 1, "None": 1, "pending": 1,
    }  # fmt: skip
