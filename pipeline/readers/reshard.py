"""Resume an epoch at another shape: what earlier legs delivered, and what they left to split.

An epoch is read in *legs*: the first at the shape it started with, and one more each time it is
resumed from a merged state (:func:`pipeline.readers.merge_states`) at any shape — ranks and
workers alike. A :class:`Leg` records only how many rows each owner of that leg had delivered;
which rows those were follows from the split of the leg, so a state holds a few ints per owner
and no id. What a leg's owners had not delivered is the next leg's *pool*, split over the new
owners the same way the first leg splits the whole index: contiguous shares of the pool for the
map-style reader, whole units (a part, or the rest of one an owner had begun) for the iterable
reader. No item is padded, repeated or dropped, whatever the shapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.readers.mix import (
    lane_positions,
    lane_starts,
    mixed_positions,
    owner_lanes,
    planned_parts,
)
from pipeline.readers.split import map_share
from pipeline.readers.stream import (
    GroupRows,
    LegOrder,
    Unit,
    owner_units,
    unit_segments,
    whole_parts,
)


@dataclass(frozen=True)
class Leg:
    """One finished stretch of an epoch: its shape and the rows each owner had delivered.

    ``rows`` is rank-major, ``workers`` owners per rank (1 for the map-style reader, whose
    workers only fetch what the rank's sampler hands them).
    """

    world_size: int
    workers: int
    rows: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.workers < 1:
            raise ValueError(f"a leg needs world_size and workers >= 1, got {self}")
        if len(self.rows) != self.world_size * self.workers:
            raise ValueError(
                f"a leg of {self.world_size} rank(s) x {self.workers} worker-owner(s) needs "
                f"{self.world_size * self.workers} row counts, got {len(self.rows)}"
            )
        if any(not isinstance(r, int) or r < 0 for r in self.rows):
            raise ValueError(f"a leg's row counts must be ints >= 0, got {list(self.rows)}")

    @property
    def owners(self) -> int:
        """Owners in this leg: ranks times worker-owners."""
        return self.world_size * self.workers

    def to_state(self) -> dict[str, Any]:
        """The leg as JSON-ready data, for a loader state."""
        return {"world_size": self.world_size, "workers": self.workers, "rows": list(self.rows)}

    @classmethod
    def from_state(cls, data: object) -> Leg:
        """A leg from :meth:`to_state`'s data; ``ValueError`` naming what is wrong."""
        if not isinstance(data, Mapping) or set(data) != {"world_size", "workers", "rows"}:
            raise ValueError(f"a leg is {{world_size, workers, rows}}, found {data!r}")
        rows = data["rows"]
        if not isinstance(rows, list):
            raise ValueError(f"a leg's rows must be a list, found {rows!r}")
        return cls(data["world_size"], data["workers"], tuple(rows))


def legs_from_state(data: object) -> tuple[Leg, ...]:
    """A state's ``legs`` list as :class:`Leg` objects (none if absent)."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ValueError(f"loader state 'legs' must be a list, found {data!r}")
    return tuple(Leg.from_state(d) for d in data)


# -- map-style --------------------------------------------------------------------------------


def map_pool(
    n_items: int,
    legs: Sequence[Leg],
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    mix: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(delivered, pool)``: positions the legs delivered, and those left, in pool order.

    Leg ``j`` splits the pool of the legs before it with
    :func:`~pipeline.readers.split.map_share`; its rank ``r`` delivered the first
    ``rows[r]`` of its share. The pool's order is each rank's undelivered rest, rank by rank.
    """
    pool = mixed_positions(n_items, seed, epoch) if mix else np.arange(n_items, dtype=np.int64)
    delivered: list[np.ndarray] = []
    for j, leg in enumerate(legs):
        if leg.workers != 1:
            raise ValueError(f"a map-style leg has one owner per rank, got {leg.workers}")
        rest = []
        for r in range(leg.world_size):
            share = map_share(
                pool, r, leg.world_size, shuffle=shuffle, seed=seed, epoch=epoch, leg=j
            )
            k = leg.rows[r]
            if k > len(share):
                raise ValueError(f"leg {j}: rank {r} delivered {k} rows of a share of {len(share)}")
            delivered.append(share[:k])
            rest.append(share[k:])
        pool = np.concatenate(rest) if rest else pool[:0]
    return _concat(delivered), pool


# -- iterable ---------------------------------------------------------------------------------


def iterable_pool(
    part_rows: Sequence[int],
    group_rows: GroupRows,
    legs: Sequence[Leg],
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    mix: bool = False,
    part_offsets: Sequence[int] | np.ndarray | None = None,
) -> tuple[np.ndarray, list[Unit]]:
    """``(delivered, pool)``: positions the legs delivered, and the units they left.

    ``delivered`` lists each owner's prefix of its stream, owner by owner (empty unless
    ``part_offsets`` is given: naming positions needs them). ``pool`` is what the next leg's
    owners split: a unit an owner had not begun stays as it was (a whole part is planned again
    by its next owner); the one it was reading becomes a tail holding the rest of its order. Row
    group sizes are asked only for parts an owner had begun with a shuffle, or all when mixing.
    """
    # Every owner streams lanes of units: one lane, planned with the owner's key, unmixed;
    # several, interleaved, when mixing (their units carry their own order).
    units = planned_parts(part_rows, group_rows, seed, epoch) if mix else whole_parts(part_rows)
    delivered: list[np.ndarray] = []
    for j, leg in enumerate(legs):
        order = LegOrder(shuffle, seed, epoch, j)
        rest: list[Unit] = []
        for o in range(leg.owners):
            if mix:
                lanes = owner_lanes(
                    units, o, leg.owners, leg.workers, seed=seed, epoch=epoch, leg=j
                )
                key = None
            else:
                lanes = [owner_units(units, o, leg.owners, leg.workers, order)]
                key = order.key(o)
            lane_rows = [sum(u.rows for u in lane) for lane in lanes]
            k = leg.rows[o]
            if k > sum(lane_rows):
                raise ValueError(
                    f"leg {j}: owner {o} delivered {k} rows of a stream of {sum(lane_rows)}"
                )
            if part_offsets is not None and k:
                delivered.append(lane_positions(lanes, part_offsets, 0, k, group_rows, key))
            for lane, skip in zip(lanes, lane_starts(lane_rows, k), strict=True):
                rest.extend(_rest(lane, group_rows, key, skip))
        units = rest
    return _concat(delivered), units


def _rest(
    units: Sequence[Unit], group_rows: GroupRows, key: tuple[int, ...] | None, skip: int
) -> Iterator[Unit]:
    """``units`` (one owner's, in its order) less their first ``skip`` rows."""
    for u in units:
        if skip >= u.rows:  # delivered, or empty: nothing of it is left
            skip -= u.rows
            continue
        if skip == 0:
            yield u
            continue
        tail = tuple(unit_segments([u], group_rows, key, skip))
        yield Unit(u.part, u.rows - skip, tail)
        skip = 0


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
