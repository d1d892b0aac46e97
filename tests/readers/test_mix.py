"""The mixing shuffle: every rank reads every part, batches mix row groups, still exactly once.

The bundle is staged in label order (part ``k`` holds label ``k`` only), as Compute outputs that
come back job by job often are. Without mixing a rank sees only its own parts' labels; with it
every rank sees every label each epoch and an iterable batch holds rows of several parts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.readers import Index, make_loader, set_epoch
from pipeline.readers.mix import cut_units, interleave, lane_starts, stratify
from pipeline.readers.stream import Segment, Unit
from tests.helpers.bundles import make_bundle, row_groups_of
from tests.helpers.resume import cut_and_reshape, shape_loader

PARTS = 8
PART_ROWS = 96  # 3 row groups of 32 per part


@pytest.fixture(scope="module")
def sorted_index(tmp_path_factory) -> Index:
    with row_groups_of(32):
        snap = make_bundle(tmp_path_factory.mktemp("sorted"), [PART_ROWS] * PARTS)
    return Index.from_snapshot(snap)


def _label(item_id: str) -> int:
    return int(item_id) // PART_ROWS  # the part it was staged in: its label


def _labels_per_rank(index, style, world, mix):
    seen = []
    for rank in range(world):
        loader = shape_loader(index, style, rank, world, 0, mix=mix)
        set_epoch(loader, 1)
        seen.append({_label(x) for b in loader for x in b["item_id"]})
    return seen


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_with_mixing_every_rank_sees_every_label_each_epoch(sorted_index, style, world):
    plain = _labels_per_rank(sorted_index, style, world, mix=False)
    assert all(len(s) <= PARTS // world + 1 for s in plain)  # the skew mixing removes
    mixed = _labels_per_rank(sorted_index, style, world, mix=True)
    assert all(s == set(range(PARTS)) for s in mixed)


def test_a_mixed_iterable_batch_draws_from_several_parts(sorted_index):
    loader = make_loader(sorted_index, style="iterable", batch_size=16, num_workers=0, mix=True)
    set_epoch(loader, 2)
    parts = [len({_label(x) for x in b["item_id"]}) for b in loader]
    assert min(parts[:-1]) > 1  # every full batch: rows of more than one part
    plain = make_loader(sorted_index, style="iterable", batch_size=16, num_workers=0)
    assert max(len({_label(x) for x in b["item_id"]}) for b in plain) == 1


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_mixed_ownership_changes_with_the_epoch_and_stays_exactly_once(sorted_index, style):
    epochs = []
    for epoch in (1, 2):
        ids = []
        for rank in range(3):
            loader = make_loader(
                sorted_index,
                style=style,
                batch_size=16,
                num_workers=0,
                mix=True,
                seed=3,
                rank=rank,
                world_size=3,
            )
            set_epoch(loader, epoch)
            ids.append([x for b in loader for x in b["item_id"]])
        every = [x for share in ids for x in share]
        assert sorted(every) == sorted_index.ids.to_pylist()  # none twice, none lost
        epochs.append([set(share) for share in ids])
    assert epochs[0] != epochs[1]  # ownership is drawn per epoch (from index, epoch, seed, shape)


def test_mixing_needs_a_shuffle(sorted_index):
    for style in ("map", "iterable"):
        with pytest.raises(ValueError, match="needs shuffle=True"):
            make_loader(sorted_index, style=style, num_workers=0, shuffle=False, mix=True)


@pytest.mark.parametrize("k", ["first", "middle", "last"])
@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 3), (3, 2)), ((1, 0), (3, 3)), ((3, 1), (1, 0))],
    ids=lambda s: f"{s[0]}x{s[1]}",
)
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_mixed_epoch_resumes_exactly_once_at_another_shape(sorted_index, style, before, after, k):
    head, tail, _ = cut_and_reshape(sorted_index, style, before, after, k, mix=True)
    assert len(head) + len(tail) == len(sorted_index)
    assert sorted(head + tail) == sorted_index.ids.to_pylist()


def test_a_mixed_state_is_refused_by_an_unmixed_loader(sorted_index):
    from pipeline.readers import ResumeMismatch

    state = make_loader(sorted_index, num_workers=0, mix=True).state_dict()
    with pytest.raises(ResumeMismatch, match="mix"):
        make_loader(sorted_index, num_workers=0).load_state_dict(state)


# -- the plan, without files ------------------------------------------------------------------


def _units(part_groups: list[list[int]]) -> list[Unit]:
    """Units of whole parts, one segment per row group (rows permuted by a fixed key)."""
    units = []
    for p, groups in enumerate(part_groups):
        first, segs = 0, []
        for g, n in enumerate(groups):
            segs.append(Segment(p, g, first, n, 0, (7,)))
            first += n
        units.append(Unit(p, sum(groups), tuple(segs)))
    return units


def _rows(units: list[Unit]) -> list[tuple[int, int]]:
    """The (part, row) pairs the units yield, in order."""
    return [(s.part, s.first + int(r)) for u in units for s in u.tail or () for r in s.order()]


groups = st.lists(st.lists(st.integers(0, 12), max_size=4), max_size=6)


@given(part_groups=groups, n=st.integers(1, 7))
def test_a_cut_keeps_every_row_once_in_order_and_evens_the_runs(part_groups, n):
    units = _units(part_groups)
    runs = cut_units(units, n)
    assert len(runs) == n
    assert [x for run in runs for x in _rows(run)] == _rows(units)  # each once, in order
    sizes = [sum(u.rows for u in run) for run in runs]
    assert sizes == [len(_rows(run)) for run in runs]  # a unit's rows count what it yields
    assert max(sizes) - min(sizes) <= 1


@given(part_groups=groups, n=st.integers(1, 7))
def test_stratified_ranks_each_hold_a_share_of_every_part(part_groups, n):
    units = _units(part_groups)
    ranks = stratify(units, n)
    assert sorted(x for r in ranks for x in _rows(r)) == sorted(_rows(units))
    for u in units:  # every part with at least a row per rank reaches every rank
        shares = [sum(v.rows for v in r if v.part == u.part) for r in ranks]
        assert max(shares) - min(shares) <= 1
        assert sum(shares) == u.rows


@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    cut=st.floats(0, 1),
    chunk=st.integers(1, 4),
)
def test_interleaved_lanes_resume_at_any_row_as_the_rest_of_the_whole(lengths, cut, chunk):
    lanes = [np.arange(n) + 100 * i for i, n in enumerate(lengths)]

    def run(start: int) -> list[int]:
        firsts = lane_starts(lengths, start)
        streams = [
            iter([lane[f:][i : i + chunk] for i in range(0, len(lane) - f, chunk)])
            for lane, f in zip(lanes, firsts, strict=True)
        ]
        out = interleave(
            streams, firsts, len, lambda a, i, j: a[i:j], lambda c, o: np.concatenate(c)[o]
        )
        return [int(x) for c in out for x in c]

    whole = run(0)
    assert sorted(whole) == sorted(int(x) for lane in lanes for x in lane)
    # round robin: among the first rows, one from each lane with rows before any second one
    assert whole[: sum(1 for n in lengths if n)] == [100 * i for i, n in enumerate(lengths) if n]
    k = int(cut * len(whole))
    assert run(k) == whole[k:]
