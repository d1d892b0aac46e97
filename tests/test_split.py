"""Ownership is exactly-once for every (items, parts, world, workers, seed, epoch)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import BatchSampler

from pipeline.readers import split
from pipeline.readers.datasets import OwnerSampler
from pipeline.readers.owner import Owner

worlds = st.integers(1, 40)
items = st.integers(0, 3000)
seeds = st.integers(0, 2**32 - 1)
epochs = st.integers(0, 1000)


@given(n=items, world=worlds, seed=seeds, epoch=epochs, shuffle=st.booleans())
def test_map_positions_every_item_exactly_once(n, world, seed, epoch, shuffle):
    shares = [
        split.map_positions(n, r, world, shuffle=shuffle, seed=seed, epoch=epoch)
        for r in range(world)
    ]
    allpos = np.concatenate(shares)
    assert np.array_equal(np.sort(allpos), np.arange(n))  # no duplicate, none missing
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1  # no padding: sizes differ by at most one


@given(n=items, world=worlds, seed=seeds, epoch=epochs, other=seeds)
def test_seed_and_epoch_never_move_an_item_to_another_owner(n, world, seed, epoch, other):
    for r in range(min(world, 5)):
        a = split.map_positions(n, r, world, shuffle=True, seed=seed, epoch=epoch)
        b = split.map_positions(n, r, world, shuffle=True, seed=other, epoch=epoch + 1)
        plain = split.map_positions(n, r, world, shuffle=False)
        assert set(a.tolist()) == set(b.tolist()) == set(plain.tolist())


@given(
    n=st.integers(0, 1500),
    world=st.integers(1, 12),
    workers=st.integers(0, 6),
    batch=st.integers(1, 64),
    seed=seeds,
    epoch=epochs,
)
def test_sampler_batches_and_worker_distribution_are_exactly_once(
    n, world, workers, batch, seed, epoch
):
    """OwnerSampler -> torch BatchSampler -> one worker per index batch, as the DataLoader does."""
    seen: list[int] = []
    for r in range(world):
        sampler = OwnerSampler(n, rank=r, world_size=world, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        per_worker: list[list[int]] = [[] for _ in range(max(workers, 1))]
        for i, b in enumerate(BatchSampler(sampler, batch, drop_last=False)):
            # _MultiProcessingDataLoaderIter puts each index batch on exactly one worker queue
            per_worker[i % max(workers, 1)].extend(b)
        assert sum(len(w) for w in per_worker) == len(sampler)
        seen.extend(x for w in per_worker for x in w)
    assert sorted(seen) == list(range(n))


part_lists = st.lists(st.integers(0, 500), min_size=0, max_size=40)


@given(rows=part_lists, world=st.integers(1, 8), workers=st.integers(0, 6))
def test_parts_go_to_ranks_first_then_to_their_workers(rows, world, workers):
    w = max(workers, 1)
    owned = split.parts_by_owner(rows, world * w, w)
    assert sorted(p for g in owned for p in g) == list(range(len(rows)))  # each part once
    ranks = [sorted(p for g in owned[r * w : (r + 1) * w] for p in g) for r in range(world)]
    # a rank's parts never depend on how many workers the ranks run
    assert ranks == split.rank_parts(rows, world) == split.parts_by_owner(rows, world)
    loads = [sum(rows[p] for p in ps) for ps in ranks]
    assert loads == split.iterable_rank_rows(rows, world)
    if rows:
        assert max(loads) - min(loads) <= max(rows)  # no worse than greedy LPT
    for r in range(world):  # inside a rank, no worker idles while it has parts to spare
        busy = sum(1 for g in owned[r * w : (r + 1) * w] if g)
        assert busy == min(len(ranks[r]), w)


def test_eight_equal_parts_on_two_ranks_of_three_workers_are_even():
    """Owners numbered rank-major used to give rank 0 five parts and rank 1 three: 500/300."""
    assert split.iterable_rank_rows([100] * 8, 2) == [400, 400]
    owned = split.parts_by_owner([100] * 8, 6, 3)
    assert [sum(100 for g in owned[r * 3 : r * 3 + 3] for _ in g) for r in (0, 1)] == [400, 400]
    assert sorted(len(g) for g in owned) == [1, 1, 1, 1, 2, 2]


def test_balance_refines_the_greedy_layout():
    # the docs' 1,009 items in 7 uneven parts: greedy alone gives 460/549, refined 502/507
    rows = [1, 300, 2, 250, 100, 199, 157]
    assert sorted(split.iterable_rank_rows(rows, 2)) == [502, 507]
    assert split.balance(rows, range(7), 1) == [list(range(7))]
    assert split.balance([5, 0, 0], [0, 1, 2], 3) == [[0], [1], [2]]  # empty parts spread out


@given(rows=part_lists, world=st.integers(1, 16), workers=st.integers(0, 8))
def test_assign_parts_whole_parts_exactly_once_and_balanced(rows, world, workers):
    owners = [Owner(r, world, w, workers) for r in range(world) for w in range(max(workers, 1))]
    n_owners = len(owners)
    assert [o.index for o in owners] == list(range(n_owners))
    assert {o.count for o in owners} == {n_owners}
    got = [split.assign_parts(rows, o.index, o.count) for o in owners]
    flat = sorted(p for g in got for p in g)
    assert flat == list(range(len(rows)))  # every part exactly once, never split
    assert all(g == sorted(g) for g in got)
    # with no more parts than owners each part has its own owner; otherwise nobody idles
    busy = sum(1 for g in got if g)
    assert busy == min(len(rows), n_owners)
    loads = [sum(rows[p] for p in g) for g in got]
    if rows:
        assert max(loads) - min(loads) <= max(rows)  # greedy LPT bound


def test_assign_parts_balances_by_rows_not_by_count():
    rows = [1000, 10, 10, 10, 10, 960]
    # by count it would be 3 + 3 parts; by rows the four small parts join the 960-row one
    assert split.parts_by_owner(rows, 2) == [[0], [1, 2, 3, 4, 5]]


def test_assign_parts_is_deterministic_and_tie_breaks_by_position():
    rows = [5, 5, 5, 5]
    assert split.parts_by_owner(rows, 2) == [[0, 2], [1, 3]]
    assert split.parts_by_owner(rows, 2) == split.parts_by_owner(list(rows), 2)


def test_part_order_only_permutes():
    parts = [1, 4, 6, 9]
    for epoch in range(5):
        got = split.part_order(parts, shuffle=True, seed=3, epoch=epoch, owner=1)
        assert sorted(got) == parts
    assert split.part_order(parts, shuffle=False, seed=3, epoch=0, owner=1) == parts
    orders = {
        tuple(split.part_order(parts, shuffle=True, seed=3, epoch=e, owner=1)) for e in range(20)
    }
    assert len(orders) > 1  # the epoch does change the order


def test_more_owners_than_items_get_empty_shares():
    shares = [split.map_positions(3, r, 8, shuffle=True, seed=1, epoch=0) for r in range(8)]
    assert sorted(np.concatenate(shares).tolist()) == [0, 1, 2]
    assert sum(1 for s in shares if len(s) == 0) == 5


@pytest.mark.parametrize(
    "args", [(0, 0, 0, 0), (2, 2, 0, 0), (-1, 2, 0, 0), (0, 1, 1, 1), (0, 1, 1, 0)]
)
def test_owner_rejects_impossible_coordinates(args):
    with pytest.raises(ValueError):
        Owner(*args)


def test_owner_current_in_main_process_and_explicit():
    assert Owner.current() == Owner(0, 1, 0, 0)
    assert Owner.current(rank=2, world_size=3) == Owner(2, 3, 0, 0)
    with pytest.raises(ValueError, match="both"):
        Owner.current(rank=1)
