"""An iterable owner's row order: the one definition the reader and its resume positions share.

An owner reads whole *units*, each the rows of one part: a whole part (planned by the owner that
reads it: with a shuffle, its row groups and each row group's rows permuted by the owner's key)
or, after an epoch was resumed at another shape (:mod:`pipeline.readers.reshard`), the rest of
a part another owner had begun, in the order that owner planned. Units go to owners by
:func:`pipeline.readers.split.parts_by_owner` over their row counts, so in an epoch's first leg
a unit is a part and this is the whole-part split. Pure: nothing here reads a file or imports
torch; row group sizes come from a callback, asked only when the stream reaches the part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.readers.split import order_key, part_order, parts_by_owner

#: Row group sizes of a part, from its footer (asked only for a part the stream reaches).
GroupRows = Callable[[int], Sequence[int]]


def row_group_order(n_groups: int, *, key: tuple[int, ...] | None, part: int) -> np.ndarray:
    """The order an owner reads one part's row groups in: as stored (no key), or permuted.

    Each (part, row group) has its own generator, so a resumed stream can start at any row
    group without drawing the permutations of the ones it skips.
    """
    if key is None:
        return np.arange(n_groups, dtype=np.int64)
    return np.random.default_rng([*key, part, 0]).permutation(n_groups)


def row_order(n_rows: int, *, key: tuple[int, ...], part: int, group: int) -> np.ndarray:
    """The order an owner yields the rows of one row group in when shuffling (a permutation)."""
    return np.random.default_rng([*key, part, 1, group]).permutation(n_rows)


@dataclass(frozen=True)
class Segment:
    """One stretch of an owner's stream: the rows of one part, or of one of its row groups.

    An unshuffled stream reads each part whole, in stored order (``group`` is None); a shuffled
    one reads row group ``group``, its rows permuted by ``key`` (the planning owner's
    :func:`~pipeline.readers.split.order_key`). ``first`` is the part's row where the stretch
    begins, ``rows`` how many rows it holds and ``skip`` how many of them, in stream order, were
    delivered before the stream (re)started. ``stop`` (None: ``rows``) ends the stretch early in
    stream order: a mixed epoch gives the rest of the row group to other owners.
    """

    part: int
    group: int | None
    first: int
    rows: int
    skip: int = 0
    key: tuple[int, ...] | None = None
    stop: int | None = None

    @property
    def end(self) -> int:
        """Where the stretch ends in stream order (``stop``, else every row)."""
        return self.rows if self.stop is None else self.stop

    @property
    def left(self) -> int:
        """Rows the stretch yields."""
        return self.end - self.skip

    def order(self) -> np.ndarray:
        """The part rows this stretch yields, relative to ``first``, in stream order."""
        if self.key is None or self.group is None:
            return np.arange(self.skip, self.end, dtype=np.int64)
        order = row_order(self.rows, key=self.key, part=self.part, group=self.group)
        return order[self.skip : self.end] if self.skip or self.stop is not None else order


@dataclass(frozen=True)
class Unit:
    """Rows of one part that one owner streams: the whole part, or the rest of a begun one.

    ``tail`` is None for a whole part (planned by the owner that reads it), else the segments
    left of a part an earlier leg's owner had begun, in that owner's order.
    """

    part: int
    rows: int
    tail: tuple[Segment, ...] | None = None


def whole_parts(part_rows: Sequence[int]) -> list[Unit]:
    """Every part as a whole unit: what an epoch's first leg splits."""
    return [Unit(p, int(r)) for p, r in enumerate(part_rows)]


@dataclass(frozen=True)
class LegOrder:
    """How one leg of an epoch orders each owner's stream: shuffled or not, and from what."""

    shuffle: bool
    seed: int
    epoch: int
    leg: int = 0

    def key(self, owner: int) -> tuple[int, ...] | None:
        """What permutes ``owner``'s row groups and rows (None: stored order)."""
        return order_key(self.seed, self.epoch, owner, self.leg) if self.shuffle else None


def owner_units(
    units: Sequence[Unit], owner: int, n_owners: int, workers_per_rank: int, order: LegOrder
) -> list[Unit]:
    """The units owner ``owner`` of ``n_owners`` streams in this leg, in streaming order.

    Units go to ranks and then workers balanced by rows, as whole parts do
    (:func:`~pipeline.readers.split.parts_by_owner`); a shuffle permutes their order only.
    """
    mine = parts_by_owner([u.rows for u in units], n_owners, workers_per_rank)[owner]
    o = order
    ranked = part_order(mine, shuffle=o.shuffle, seed=o.seed, epoch=o.epoch, owner=owner, leg=o.leg)
    return [units[i] for i in ranked]


def owner_stream(
    units: Sequence[Unit],
    group_rows: GroupRows,
    owner: int,
    n_owners: int,
    workers_per_rank: int,
    order: LegOrder,
    start: int = 0,
) -> Iterator[Segment]:
    """Owner ``owner``'s stream this leg, from its row ``start`` on, as segments in order.

    ``units`` is what the leg splits: every whole part (:func:`whole_parts`, an epoch's first
    leg) or what earlier legs left (:func:`pipeline.readers.reshard.iterable_pool`).
    """
    mine = owner_units(units, owner, n_owners, workers_per_rank, order)
    return owner_segments(mine, group_rows, order.key(owner), start)


def owner_segments(
    mine: Sequence[Unit], group_rows: GroupRows, key: tuple[int, ...] | None, start: int = 0
) -> Iterator[Segment]:
    """An owner's units (:func:`owner_units`) as segments, from its row ``start`` on.

    What lies before ``start`` is left out: whole units and row groups are not named at all, and
    the segment holding ``start`` skips its delivered rows. The segments come lazily, so a reader
    opens each part when the plan first needs it.
    """
    total = sum(u.rows for u in mine)
    if not 0 <= start <= total:
        raise ValueError(f"resume point {start} is past the {total} rows this owner streams")
    return unit_segments(mine, group_rows, key, start)


def unit_segments(
    units: Iterable[Unit], group_rows: GroupRows, key: tuple[int, ...] | None, skip: int = 0
) -> Iterator[Segment]:
    """The segments of ``units`` in order, their first ``skip`` rows left out.

    A whole unit is planned here with ``key`` (its reading owner's; None streams parts in
    stored order); a tail keeps the segments, and so the order, it was left with.
    """
    for u in units:
        if skip and skip >= u.rows:  # delivered before the resume point
            skip -= u.rows
            continue
        if u.tail is not None:
            yield from _skipped(u.tail, skip)
        else:
            yield from _planned(u, group_rows, key, skip)
        skip = 0


def _planned(
    u: Unit, group_rows: GroupRows, key: tuple[int, ...] | None, skip: int
) -> Iterator[Segment]:
    if key is None or u.rows == 0:
        yield Segment(u.part, None, 0, u.rows, skip)
        return
    sizes = [int(n) for n in group_rows(u.part)]
    if sum(sizes) != u.rows:
        raise ValueError(f"part {u.part} holds {u.rows} rows, its row groups {sum(sizes)}")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for g in row_group_order(len(sizes), key=key, part=u.part).tolist():
        if skip and skip >= sizes[g]:  # delivered before the resume point
            skip -= sizes[g]
            continue
        yield Segment(u.part, g, int(starts[g]), sizes[g], skip, key)
        skip = 0


def _skipped(segments: Iterable[Segment], skip: int) -> Iterator[Segment]:
    for seg in segments:
        left = seg.left
        if skip and skip >= left:
            skip -= left
            continue
        yield dataclasses.replace(seg, skip=seg.skip + skip) if skip else seg
        skip = 0


def stream_positions(
    segments: Iterable[Segment], part_offsets: Sequence[int] | np.ndarray, stop: int | None = None
) -> np.ndarray:
    """Index positions of ``segments``' rows in order (their first ``stop``), as ``int64``.

    Stops drawing segments once ``stop`` rows are named, so a lazy plan reads no further.
    """
    return first_rows(segment_positions(segments, part_offsets), stop)


def segment_positions(
    segments: Iterable[Segment], part_offsets: Sequence[int] | np.ndarray
) -> Iterator[np.ndarray]:
    """Each segment's rows as index positions, in stream order, one array per segment."""
    for seg in segments:
        yield int(part_offsets[seg.part]) + seg.first + seg.order()


def first_rows(chunks: Iterable[np.ndarray], stop: int | None) -> np.ndarray:
    """The first ``stop`` (None: all) entries of ``chunks`` as one ``int64`` array, drawing no
    chunk past them."""
    out: list[np.ndarray] = []
    left = stop
    if left is None or left > 0:
        for chunk in chunks:
            if left is not None:
                chunk = chunk[:left]
                left -= len(chunk)
            out.append(chunk)
            if left is not None and left <= 0:
                break
    return np.concatenate(out).astype(np.int64, copy=False) if out else np.zeros(0, np.int64)
