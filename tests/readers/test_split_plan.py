"""The split proof the disjoint_index check runs: it passes real splits and catches broken ones."""

import numpy as np
import pytest

from pipeline.readers import split
from pipeline.readers.split import plan_split


@pytest.mark.parametrize(("n", "world", "workers"), [(1009, 2, 2), (5, 8, 3), (0, 3, 0)])
def test_real_splits_are_exactly_once(n, world, workers):
    parts = [n // 7 + (1 if i < n % 7 else 0) for i in range(7)]
    plan = plan_split(n, parts, world, workers, seed=3)
    assert plan.ok, plan.problems
    assert sum(plan.rank_sizes) == n and max(plan.rank_sizes) - min(plan.rank_sizes) <= 1


def test_a_split_that_pads_or_overlaps_is_caught(monkeypatch):
    real = split.map_positions

    def padded(n_items, rank, world_size, **kw):  # DistributedSampler-style padding
        out = real(n_items, rank, world_size, **kw)
        return np.concatenate([out, out[:1]]) if rank == world_size - 1 else out

    monkeypatch.setattr(split, "map_positions", padded)
    plan = plan_split(1009, [1009], 2, 2)
    assert not plan.ok and "1 held more than once" in plan.problems[0]


def test_a_split_that_drops_or_strays_is_caught(monkeypatch):
    real = split.map_positions

    def stray(n_items, rank, world_size, **kw):  # the last item replaced by one past the end
        out = real(n_items, rank, world_size, **kw)
        return np.where(out == n_items - 1, n_items, out)

    monkeypatch.setattr(split, "map_positions", stray)
    plan = plan_split(1009, [1009], 2, 2)
    assert not plan.ok and "1 by no rank, 1 outside the index" in plan.problems[0]


@pytest.mark.parametrize(("n", "world"), [(1009, 2), (5, 8), (0, 3), (10, 3)])
def test_the_layout_without_the_proof_has_the_same_shares(n, world):
    parts = [n // 7 + (1 if i < n % 7 else 0) for i in range(7)]
    proved, laid_out = plan_split(n, parts, world, 2), plan_split(n, parts, world, 2, prove=False)
    assert laid_out == proved


def test_a_part_with_two_owners_is_caught(monkeypatch):
    monkeypatch.setattr(split, "parts_by_owner", lambda rows, n, *_: [[0, 1], [1]] + [[]] * (n - 2))
    plan = plan_split(10, [5, 5], 2, 1)
    assert not plan.ok and "parts" in plan.problems[0]


def test_plan_reports_the_iterable_rows_per_rank():
    """The index metadata shows how evenly the iterable path loads the ranks."""
    plan = plan_split(800, [100] * 8, 2, 3)
    assert plan.iterable_rank_rows == [400, 400] and plan.iterable_rank_spread == 0
    # the docs' 1,009 items in 7 uneven parts: as even as whole parts allow
    plan = plan_split(1009, [1, 300, 2, 250, 100, 199, 157], 2, 2)
    assert plan.ok and sorted(plan.iterable_rank_rows) == [502, 507]
    assert plan_split(0, [], 3, 0).iterable_rank_rows == [0, 0, 0]
