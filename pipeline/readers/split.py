"""Who owns which item, and in what order: pure functions of sizes and owner coordinates.

Ownership is laid out first and a shuffle is applied only inside an owner's share, so no seed,
epoch or worker can ever move an item to a second owner (the lesson of MosaicML Streaming's
partitioning, without its padding). Nothing here pads, repeats or drops an item, reads a file or
imports torch. :mod:`pipeline.readers.stream` turns an iterable owner's parts into its row order;
:func:`plan_split` proves a planned split exactly-once by running these same functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from pipeline.readers.balance import balance


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


def order_key(seed: int, epoch: int, owner: int, leg: int = 0) -> tuple[int, ...]:
    """What seeds an owner's order in one leg of an epoch (see :mod:`pipeline.readers.reshard`).

    ``(seed, epoch, owner)`` in the first leg, the leg appended in later ones, so an epoch
    resumed at another shape draws fresh orders for its new owners. It never decides ownership.
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return (seed, epoch, owner) if leg == 0 else (seed, epoch, owner, leg)


def owner_rng(seed: int, epoch: int, rank: int, leg: int = 0) -> np.random.Generator:
    """The generator that orders one rank's share in one epoch; it never decides ownership."""
    return np.random.default_rng(list(order_key(seed, epoch, rank, leg)))


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


def map_share(
    pool: np.ndarray, rank: int, world_size: int, *, shuffle: bool, seed: int, epoch: int, leg: int
) -> np.ndarray:
    """Rank ``rank``'s share of ``pool`` (the positions a leg of an epoch splits), in its order.

    The same contiguous layout as :func:`map_positions` over the pool's order, permuted by the
    rank's key for this leg; with ``pool = arange(n)`` and ``leg=0`` it is ``map_positions``.
    """
    start, stop = share_bounds(len(pool), rank, world_size)
    share = np.array(pool[start:stop], dtype=np.int64)
    if shuffle:
        owner_rng(seed, epoch, rank, leg).shuffle(share)
    return share


def assign_parts(
    part_rows: Sequence[int], owner_index: int, n_owners: int, workers_per_rank: int = 1
) -> list[int]:
    """Whole parts owner ``owner_index`` of ``n_owners`` reads, in part order.

    Owners are numbered rank-major (``rank * workers_per_rank + worker``); see
    :func:`parts_by_owner` for how parts are laid out. Deterministic from the row counts alone —
    never from a path's hash — so every process computes the same answer.
    """
    _check_owner(owner_index, n_owners, "owner")
    return parts_by_owner(part_rows, n_owners, workers_per_rank)[owner_index]


def parts_by_owner(
    part_rows: Sequence[int], n_owners: int, workers_per_rank: int = 1
) -> list[list[int]]:
    """Every owner's parts, rank-major: a list of ``n_owners`` sorted part lists.

    Whole parts go to the ``n_owners / workers_per_rank`` ranks first, balanced by rows, and
    then each rank's parts to its ``workers_per_rank`` workers, balanced the same way (see
    :func:`balance`). So a rank's share of rows never depends on how many workers it or any
    other rank runs, and ranks stay even under DDP even when parts outnumber owners only a little
    (8 equal parts on 2 ranks x 3 workers: 400/400 rows, not 500/300).
    With ``workers_per_rank=1`` this is one balanced layout over ``n_owners``.
    """
    if n_owners < 1:
        raise ValueError(f"owner count must be >= 1, got {n_owners}")
    if workers_per_rank < 1 or n_owners % workers_per_rank:
        raise ValueError(
            f"workers_per_rank must be >= 1 and divide the owner count {n_owners}, "
            f"got {workers_per_rank}"
        )
    if any(r < 0 for r in part_rows):
        raise ValueError("part row counts must be >= 0")
    layout = _layout(tuple(int(r) for r in part_rows), n_owners, workers_per_rank)
    return [list(parts) for parts in layout]


# Every owner of an epoch asks for the same layout (and a reader's length asks for all of them),
# so it is balanced once per (sizes, shape), not once per owner per question.
@lru_cache(maxsize=64)
def _layout(
    rows: tuple[int, ...], n_owners: int, workers_per_rank: int
) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    for rank_parts in balance(rows, range(len(rows)), n_owners // workers_per_rank):
        out.extend(tuple(b) for b in balance(rows, rank_parts, workers_per_rank))
    return tuple(out)


def _rank_parts(part_rows: Sequence[int], world_size: int) -> list[list[int]]:
    """The parts each rank's workers share on the iterable path (independent of worker counts)."""
    return parts_by_owner(part_rows, world_size)


def iterable_rank_rows(part_rows: Sequence[int], world_size: int) -> list[int]:
    """Rows each rank reads on the iterable path: the per-rank spread to report and watch."""
    return [sum(part_rows[p] for p in ps) for ps in _rank_parts(part_rows, world_size)]


def owner_index(rank: int, world_size: int, worker: int, num_workers: int) -> tuple[int, int]:
    """Flatten (rank, worker) into ``(owner_index, n_owners)``; ``num_workers=0`` counts as one."""
    _check_owner(rank, world_size, "rank")
    workers = max(num_workers, 1)
    _check_owner(worker, workers, "worker")
    return rank * workers + worker, world_size * workers


def part_order(
    parts: Sequence[int], *, shuffle: bool, seed: int, epoch: int, owner: int, leg: int = 0
) -> list[int]:
    """The order an owner streams its parts in: as given, or permuted by its key for the leg."""
    parts = list(parts)
    if shuffle and parts:
        rng = owner_rng(seed, epoch, owner, leg)
        parts = [parts[i] for i in rng.permutation(len(parts))]
    return parts


# -- proving a planned split ----------------------------------------------------------------


class ItemOwners(NamedTuple):
    """How often each item of an index is named by a set of positions."""

    outside: int  # positions that name no item (below 0 or past the last)
    repeated: np.ndarray  # the items named more than once, as positions
    unowned: np.ndarray  # the items never named, as positions


def item_owners(positions: np.ndarray, n_items: int) -> ItemOwners:
    """Count, per item of ``n_items``, how often ``positions`` names it (linear, no sort)."""
    inside = (positions >= 0) & (positions < n_items)
    per_item = np.bincount(positions[inside], minlength=n_items)
    return ItemOwners(
        int(len(positions) - inside.sum()),
        np.flatnonzero(per_item > 1),
        np.flatnonzero(per_item == 0),
    )


def _owners_per_item(shares: Sequence[np.ndarray], n_items: int) -> list[str]:
    """What is wrong with ``shares`` as a split of ``n_items`` items: positions outside the
    index, items held twice or by no one."""
    every = np.concatenate(shares) if shares else np.zeros(0, np.int64)
    owners = item_owners(every, n_items)
    repeated, unowned = len(owners.repeated), len(owners.unowned)
    if not (owners.outside or repeated or unowned):
        return []
    return [
        f"map-style shares hold {len(every)} positions for {n_items} items ({repeated} held "
        f"more than once, {unowned} by no rank, {owners.outside} outside the index)"
    ]


@dataclass(frozen=True)
class SplitPlan:
    """Who owns what: map-style positions per rank, whole parts per (rank, worker) owner."""

    n_items: int
    rank_sizes: list[int]
    part_owners: list[list[int]]
    problems: list[str]
    #: rows each rank reads on the iterable path (whole parts, balanced by rows across ranks)
    iterable_rank_rows: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every item and every part has exactly one owner."""
        return not self.problems

    @property
    def iterable_rank_spread(self) -> int:
        """Rows between the busiest and the idlest rank on the iterable path (0 is even)."""
        rows = self.iterable_rank_rows
        return max(rows) - min(rows) if rows else 0


def plan_split(
    n_items: int,
    part_rows: Sequence[int],
    world_size: int,
    num_workers: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    prove: bool = True,
) -> SplitPlan:
    """Lay out the split for ``world_size`` ranks of ``num_workers`` workers and check it.

    The plan also reports the per-rank rows of the iterable path (``iterable_rank_rows`` and
    its ``iterable_rank_spread``), for the index metadata: ranks that read very different row
    counts idle in ``Join`` under DDP. ``prove`` draws every rank's shuffled positions, as the
    readers do, and counts each item's owners (linear in the items); without it the map-style
    shares are laid out from their bounds alone and only the parts are checked.
    """
    problems: list[str] = []
    if prove:
        shares = [
            map_positions(n_items, r, world_size, shuffle=True, seed=seed, epoch=epoch)
            for r in range(world_size)
        ]
        sizes = [len(s) for s in shares]
        problems += _owners_per_item(shares, n_items)
    else:
        sizes = [len(range(*share_bounds(n_items, r, world_size))) for r in range(world_size)]
    if sizes and max(sizes) - min(sizes) > 1:
        problems.append(f"map-style shares differ by more than one item: {sizes}")
    workers = max(num_workers, 1)
    parts = parts_by_owner(part_rows, max(1, world_size * workers), workers)
    held = sorted(p for owned in parts for p in owned)
    if held != list(range(len(part_rows))):
        problems.append(
            f"iterable owners hold parts {held}; expected each of {len(part_rows)} once"
        )
    rank_rows = [
        sum(part_rows[p] for owned in parts[r * workers : (r + 1) * workers] for p in owned)
        for r in range(world_size)
    ]
    return SplitPlan(n_items, sizes, parts, problems, rank_rows)
