"""An epoch cut at one shape and resumed at others is read exactly once: the plan, without files.

Each example draws a chain of shapes (ranks x workers), cuts every owner of each leg at a random
point of its order, and resumes the rest at the next shape; the last shape reads to the end.
Every position is then named exactly once across the legs, for both readers, whatever the shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.readers import mix, split, stream
from pipeline.readers.reshard import (
    Leg,
    iterable_pool,
    legs_from_state,
    map_pool,
)

shapes = st.tuples(st.integers(1, 3), st.integers(0, 3))  # (ranks, workers)
chains = st.lists(shapes, min_size=2, max_size=4)
cuts = st.lists(st.floats(0, 1), min_size=48, max_size=48)
layouts = st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=4), min_size=1, max_size=9)
orders = dict(seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 50), shuffle=st.booleans())


def _map_shares(n, legs, world, *, shuffle, seed, epoch, mix=False):
    _, pool = map_pool(n, legs, shuffle=shuffle, seed=seed, epoch=epoch, mix=mix)
    leg = len(legs)
    return [
        split.map_share(pool, r, world, shuffle=shuffle, seed=seed, epoch=epoch, leg=leg)
        for r in range(world)
    ]


@given(n=st.integers(0, 400), chain=chains, cut=cuts, mix=st.booleans(), **orders)
def test_a_map_epoch_resumed_at_any_shapes_is_read_exactly_once(
    n, chain, cut, mix, seed, epoch, shuffle
):
    order = dict(shuffle=shuffle or mix, seed=seed, epoch=epoch, mix=mix)
    legs: list[Leg] = []
    delivered: list[np.ndarray] = []
    frac = iter(cut)
    for world, _workers in chain[:-1]:  # workers fetch what the rank's sampler hands out
        shares = _map_shares(n, legs, world, **order)
        rows = tuple(int(next(frac) * len(s)) for s in shares)
        delivered += [s[:k] for s, k in zip(shares, rows, strict=True)]
        legs.append(Leg(world, 1, rows))
    before, _ = map_pool(n, legs, **order)
    assert sorted(before.tolist()) == sorted(np.concatenate([[], *delivered]).tolist())
    last = _map_shares(n, legs, chain[-1][0], **order)
    every = np.concatenate([before, *last])
    assert sorted(every.tolist()) == list(range(n))  # none twice, none lost, no padding
    sizes = [len(s) for s in last]
    assert max(sizes) - min(sizes) <= 1  # the rest is split evenly


def _streams(groups, units, leg, world, workers, *, shuffle, seed, epoch):
    rows = [sum(g) for g in groups]
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    w = max(workers, 1)
    return [
        stream.stream_positions(
            stream.owner_stream(
                stream.whole_parts(rows) if units is None else units,
                groups.__getitem__,
                o,
                world * w,
                w,
                stream.LegOrder(shuffle, seed, epoch, leg),
            ),
            offsets,
        )
        for o in range(world * w)
    ]


@given(groups=layouts, chain=chains, cut=cuts, **orders)
def test_an_iterable_epoch_resumed_at_any_shapes_is_read_exactly_once(
    groups, chain, cut, seed, epoch, shuffle
):
    rows = [sum(g) for g in groups]
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    legs: list[Leg] = []
    delivered: list[np.ndarray] = []
    frac = iter(cut)
    order = dict(shuffle=shuffle, seed=seed, epoch=epoch)
    for world, workers in chain[:-1]:
        units = iterable_pool(rows, groups.__getitem__, legs, **order)[1] if legs else None
        streams = _streams(groups, units, len(legs), world, workers, **order)
        counts = tuple(int(next(frac) * len(s)) for s in streams)
        delivered += [s[:k] for s, k in zip(streams, counts, strict=True)]
        legs.append(Leg(world, max(workers, 1), counts))
    before, units = iterable_pool(rows, groups.__getitem__, legs, part_offsets=offsets, **order)
    assert before.tolist() == np.concatenate([[], *delivered]).astype(np.int64).tolist()
    for u in units:  # the rest of a begun part stays with one owner, in its order
        assert u.rows == sum(s.rows - s.skip for s in u.tail) if u.tail else u.rows == rows[u.part]
    world, workers = chain[-1]
    last = _streams(groups, units, len(legs), world, workers, **order)
    every = np.concatenate([before, *last])
    assert sorted(every.tolist()) == list(range(sum(rows)))  # none twice, none lost
    owner_of: dict[int, int] = {}
    for o, s in enumerate(last):  # a unit is read whole: no part split between two new owners
        for p in set((np.searchsorted(offsets, s, side="right") - 1).tolist()):
            assert owner_of.setdefault(p, o) == o
    assert len({u.part for u in units}) == len(units)  # one unit per part: its one owner's rest


def _mixed_streams(units, leg, world, workers, offsets, *, seed, epoch):
    w = max(workers, 1)
    lanes = [
        mix.owner_lanes(units, o, world * w, w, seed=seed, epoch=epoch, leg=leg)
        for o in range(world * w)
    ]
    return [mix.lane_positions(lane, offsets) for lane in lanes]


@given(groups=layouts, chain=chains, cut=cuts, seed=orders["seed"], epoch=orders["epoch"])
def test_a_mixed_iterable_epoch_resumed_at_any_shapes_is_read_exactly_once(
    groups, chain, cut, seed, epoch
):
    rows = [sum(g) for g in groups]
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    order = dict(shuffle=True, seed=seed, epoch=epoch, mix=True)
    legs: list[Leg] = []
    delivered: list[np.ndarray] = []
    frac = iter(cut)
    for j, (world, workers) in enumerate(chain):
        units = iterable_pool(rows, groups.__getitem__, legs, **order)[1]
        streams = _mixed_streams(units, j, world, workers, offsets, seed=seed, epoch=epoch)
        if j == 0:  # a first leg gives every rank a share of every part
            for p, n in enumerate(rows):
                per_rank = [
                    sum(
                        int(np.sum((s >= offsets[p]) & (s < offsets[p + 1])))
                        for s in streams[r * max(workers, 1) : (r + 1) * max(workers, 1)]
                    )
                    for r in range(world)
                ]
                assert max(per_rank) - min(per_rank) <= 1 and sum(per_rank) == n
        if j == len(chain) - 1:
            delivered += streams  # the last shape reads to the end
            break
        counts = tuple(int(next(frac) * len(s)) for s in streams)
        delivered += [s[:k] for s, k in zip(streams, counts, strict=True)]
        legs.append(Leg(world, max(workers, 1), counts))
        before, _ = iterable_pool(rows, groups.__getitem__, legs, part_offsets=offsets, **order)
        assert sorted(before.tolist()) == sorted(np.concatenate([[], *delivered]).tolist())
    every = np.concatenate([[], *delivered]).astype(np.int64)
    assert sorted(every.tolist()) == list(range(sum(rows)))  # none twice, none lost


def test_a_leg_is_small_plain_data_and_refuses_nonsense():
    leg = Leg(2, 3, (1, 2, 3, 4, 5, 6))
    assert legs_from_state([leg.to_state()]) == (leg,)
    with pytest.raises(ValueError, match="needs 6 row counts"):
        Leg(2, 3, (1, 2))
    with pytest.raises(ValueError, match=">= 0"):
        Leg(1, 1, (-1,))
    with pytest.raises(ValueError, match="world_size, workers, rows"):
        legs_from_state([{"world_size": 1}])
    with pytest.raises(ValueError, match="delivered 9 rows of a share of 5"):
        map_pool(10, [Leg(2, 1, (9, 0))], shuffle=False, seed=0, epoch=0)
