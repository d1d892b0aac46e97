"""Prove a planned split is exactly-once before training on it: every item one owner, no padding.

The proof runs the same pure split functions the readers use (``pipeline.split``), so what it
checks is what the samplers and iterable datasets will do, not a second description of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline import split


@dataclass(frozen=True)
class SplitPlan:
    """Who owns what: map-style positions per rank, whole parts per (rank, worker) owner."""

    n_items: int
    rank_sizes: list[int]
    part_owners: list[list[int]]
    problems: list[str]

    @property
    def ok(self) -> bool:
        """Whether every item and every part has exactly one owner."""
        return not self.problems


def plan_split(
    n_items: int,
    part_rows: Sequence[int],
    world_size: int,
    num_workers: int,
    *,
    seed: int = 0,
    epoch: int = 0,
) -> SplitPlan:
    """Lay out the split for ``world_size`` ranks of ``num_workers`` workers and check it."""
    problems: list[str] = []
    shares = [
        split.map_positions(n_items, r, world_size, shuffle=True, seed=seed, epoch=epoch)
        for r in range(world_size)
    ]
    sizes = [len(s) for s in shares]
    every = np.sort(np.concatenate(shares)) if shares else np.zeros(0, np.int64)
    if not np.array_equal(every, np.arange(n_items)):
        dup = int(len(every) - len(np.unique(every)))
        problems.append(
            f"map-style shares hold {len(every)} positions for {n_items} items ({dup} repeated)"
        )
    if sizes and max(sizes) - min(sizes) > 1:
        problems.append(f"map-style shares differ by more than one item: {sizes}")
    owners = max(1, world_size * max(num_workers, 1))
    parts = split.assignment(part_rows, owners)
    held = sorted(p for owned in parts for p in owned)
    if held != list(range(len(part_rows))):
        problems.append(
            f"iterable owners hold parts {held}; expected each of {len(part_rows)} once"
        )
    return SplitPlan(n_items, sizes, parts, problems)
