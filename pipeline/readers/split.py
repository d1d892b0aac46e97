"""Who owns which item: pure functions of sizes and owner coordinates, no I/O, no torch.

Ownership is laid out first and a shuffle is applied only inside an owner's share, so no seed,
epoch or worker can ever move an item to a second owner (the lesson of MosaicML Streaming's
partitioning, without its padding). Nothing here pads, repeats or drops an item.
:func:`plan_split` proves a planned split exactly-once by running these same functions.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _check_owner(index: int, count: int, what: str) -> None:
    if count < 1:
        raise ValueError(f"{what} count must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ValueError(f"{what} {index} is outside 0..{count - 1}")


def share_bounds(n_items: int, rank: int, world_size: int) -> tuple[int, int]:
    """The half-open position range ``[start, stop)`` rank ``rank`` owns out of ``n_items``.

    Boundaries are ``floor(r * n / W)``, so shares are contiguous, cover every position once and
    differ in size by at most one; a rank past the items gets an empty range.
    """
    if n_items < 0:
        raise ValueError(f"n_items must be >= 0, got {n_items}")
    _check_owner(rank, world_size, "rank")
    return rank * n_items // world_size, (rank + 1) * n_items // world_size


def owner_rng(seed: int, epoch: int, rank: int) -> np.random.Generator:
    """The generator that orders one rank's share in one epoch; it never decides ownership."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return np.random.default_rng([seed, epoch, rank])


def map_positions(
    n_items: int, rank: int, world_size: int, *, shuffle: bool, seed: int = 0, epoch: int = 0
) -> np.ndarray:
    """Positions rank ``rank`` reads this epoch: its contiguous share, permuted if ``shuffle``.

    The share comes from :func:`share_bounds`; ``seed`` and ``epoch`` only choose the order
    within it. Returns an ``int64`` array.
    """
    start, stop = share_bounds(n_items, rank, world_size)
    positions = np.arange(start, stop, dtype=np.int64)
    if shuffle:
        owner_rng(seed, epoch, rank).shuffle(positions)
    return positions


def assign_parts(part_rows: Sequence[int], owner_index: int, n_owners: int) -> list[int]:
    """Whole parts owner ``owner_index`` of ``n_owners`` reads, in part order.

    Greedy longest-processing-time: parts in decreasing row count (ties by lower position) each
    go to the owner with the fewest rows so far (ties by lower owner index). Deterministic from
    the row counts alone — never from a path's hash — so every process computes the same answer.
    """
    _check_owner(owner_index, n_owners, "owner")
    return parts_by_owner(part_rows, n_owners)[owner_index]


def parts_by_owner(part_rows: Sequence[int], n_owners: int) -> list[list[int]]:
    """Every owner's parts (see :func:`assign_parts`): a list of ``n_owners`` sorted part lists."""
    if n_owners < 1:
        raise ValueError(f"owner count must be >= 1, got {n_owners}")
    if any(r < 0 for r in part_rows):
        raise ValueError("part row counts must be >= 0")
    order = sorted(range(len(part_rows)), key=lambda p: (-part_rows[p], p))
    heap = [(0, 0, o) for o in range(n_owners)]  # (rows, parts held, owner)
    owned: list[list[int]] = [[] for _ in range(n_owners)]
    for p in order:
        rows, held, o = heapq.heappop(heap)
        owned[o].append(p)
        # parts held breaks ties between owners of equal rows, so empty parts spread out too
        heapq.heappush(heap, (rows + part_rows[p], held + 1, o))
    return [sorted(ps) for ps in owned]


def owner_index(rank: int, world_size: int, worker: int, num_workers: int) -> tuple[int, int]:
    """Flatten (rank, worker) into ``(owner_index, n_owners)``; ``num_workers=0`` counts as one."""
    _check_owner(rank, world_size, "rank")
    workers = max(num_workers, 1)
    _check_owner(worker, workers, "worker")
    return rank * workers + worker, world_size * workers


def part_order(
    parts: Sequence[int], *, shuffle: bool, seed: int, epoch: int, owner: int
) -> list[int]:
    """The order an owner streams its parts in: as given, or permuted by (seed, epoch, owner)."""
    parts = list(parts)
    if shuffle and parts:
        rng = owner_rng(seed, epoch, owner)
        parts = [parts[i] for i in rng.permutation(len(parts))]
    return parts


# -- proving a planned split ----------------------------------------------------------------


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
        map_positions(n_items, r, world_size, shuffle=True, seed=seed, epoch=epoch)
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
    parts = parts_by_owner(part_rows, owners)
    held = sorted(p for owned in parts for p in owned)
    if held != list(range(len(part_rows))):
        problems.append(
            f"iterable owners hold parts {held}; expected each of {len(part_rows)} once"
        )
    return SplitPlan(n_items, sizes, parts, problems)
