"""The mixing shuffle (``mix=True``): every rank reads every part, batches draw from several.

Without it a rank owns a contiguous share (map-style) or whole parts (iterable), so data staged
in label or time order — Compute outputs come back job by job — trains each rank on a slice of
the labels. With it:

* map-style: the epoch's positions are permuted as one (as ``DistributedSampler`` does, without
  its padding) before the contiguous split, so every rank draws from every part;
* iterable: each part's rows, in an order drawn per epoch (its row groups permuted, and each row
  group's rows), are cut into one piece per rank, so every rank reads a share of every part
  (:func:`stratify`). A rank's pieces, permuted, are cut over its workers, and each owner
  streams its pieces in :data:`LANES` lanes whose rows it interleaves one by one, so a batch
  holds rows of several parts.

Decode work stays bounded: a row group is decoded by each owner whose piece it straddles, so
a rank decodes its share of every part plus at most one row group per part at a cut (with a
single row group per part, every rank decodes the whole bundle: stage smaller row groups). An
owner holds one decoded row group per lane. A leg resumed at another shape cuts what is left
contiguously over the new owners instead (:mod:`pipeline.readers.reshard`).

Ownership is a pure function of (index, epoch, seed, shape), never of a seed alone, and each
item still has exactly one owner. Nothing here reads a file or imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np

from pipeline.readers.stream import (
    GroupRows,
    Segment,
    Unit,
    first_rows,
    row_group_order,
    segment_positions,
    unit_segments,
)

#: Lanes an owner interleaves when mixing: rows of this many row groups in every batch.
LANES = 4

T = TypeVar("T")


def epoch_rng(seed: int, epoch: int, leg: int = 0) -> np.random.Generator:
    """The generator that draws one epoch's (one leg's) mixed ownership: the same on every rank."""
    key = [seed, epoch, 1 << 32] if leg == 0 else [seed, epoch, 1 << 32, leg]
    return np.random.default_rng(key)


def mixed_key(seed: int, epoch: int) -> tuple[int, ...]:
    """What permutes the rows inside each row group of a mixed epoch (the same for any owner)."""
    return (seed, epoch, 1 << 32)


def mixed_positions(n_items: int, seed: int, epoch: int) -> np.ndarray:
    """Every position, permuted for this epoch: the map-style pool a mixed epoch splits."""
    return epoch_rng(seed, epoch).permutation(n_items).astype(np.int64)


def lane_starts(lane_rows: Sequence[int], start: int) -> list[int]:
    """Rows each lane had delivered when the interleaved stream had delivered ``start``.

    The stream takes one row from each lane still running, in lane order, round after round;
    so after ``start`` rows each lane's count follows from the lane lengths alone.
    """
    left = [int(n) for n in lane_rows]
    if not 0 <= start <= sum(left):
        raise ValueError(f"resume point {start} is past the {sum(left)} rows of the lanes")
    done = [0] * len(left)
    while start:
        active = [i for i, n in enumerate(left) if n]
        rounds = min(min(left[i] for i in active), start // len(active))
        for i in active:
            done[i] += rounds
            left[i] -= rounds
        start -= rounds * len(active)
        if rounds == 0:  # fewer rows than lanes running: one more row from the first ones
            for i in active[:start]:
                done[i] += 1
            break
    return done


def interleave(
    lanes: Sequence[Iterator[T]],
    firsts: Sequence[int],
    length: Callable[[T], int],
    piece: Callable[[T, int, int], T],
    merge: Callable[[list[T], np.ndarray], T],
) -> Iterator[T]:
    """Round-robin the lanes row by row: yield chunks whose rows are in the interleaved order.

    ``lanes`` yield chunks (tables or position arrays) of their rows; ``firsts[i]`` is how many
    rows lane ``i`` had delivered before it (re)started, so the round robin resumes in step with
    :func:`lane_starts`. ``piece(chunk, a, b)`` slices rows ``[a, b)``; ``merge(chunks, order)``
    concatenates chunks and takes rows in ``order``. Each yielded chunk is one round stretch:
    the same number of rows from every lane still running.
    """
    buffers: list[T | None] = [None] * len(lanes)
    running = list(range(len(lanes)))
    # lanes that had delivered one row more than the last ones start a round later
    lead = max(firsts, default=0)
    behind = [i for i in running if firsts[i] < lead]
    if behind and len(behind) < len(running):
        catch_up = [_next(lanes[i], buffers, i, length) for i in behind]
        parts = [piece(c, 0, 1) for c in catch_up if c is not None]
        for i in behind:
            b = buffers[i]
            if b is not None:
                buffers[i] = piece(b, 1, length(b)) if length(b) > 1 else None
        if parts:
            yield merge(parts, np.arange(len(parts)))
    while running:
        for i in list(running):
            if buffers[i] is None and _next(lanes[i], buffers, i, length) is None:
                running.remove(i)
        if not running:
            return
        m = min(length(buffers[i]) for i in running)  # type: ignore[arg-type]
        chunks = [piece(buffers[i], 0, m) for i in running]  # type: ignore[arg-type]
        for i in running:
            b = buffers[i]
            assert b is not None
            buffers[i] = piece(b, m, length(b)) if length(b) > m else None
        k = len(chunks)
        yield merge(chunks, (np.arange(m)[:, None] + np.arange(k)[None, :] * m).ravel())


def _next(lane: Iterator[T], buffers: list, i: int, length: Callable[[T], int]) -> T | None:
    for chunk in lane:
        if length(chunk):
            buffers[i] = chunk
            return chunk
    buffers[i] = None
    return None


# -- planning a mixed leg ----------------------------------------------------------------------


def planned_parts(
    part_rows: Sequence[int], group_rows: GroupRows, seed: int, epoch: int
) -> list[Unit]:
    """Every non-empty part as one unit in this epoch's mixed order: what a first leg splits.

    The row groups are permuted per (seed, epoch, part) and each row group's rows too, the same
    for every owner, so a cut anywhere in a part names the same rows on every rank. Asks every
    such part's row group sizes.
    """
    key = mixed_key(seed, epoch)
    units: list[Unit] = []
    for p, rows in enumerate(part_rows):
        if not rows:
            continue
        sizes = [int(n) for n in group_rows(p)]
        if sum(sizes) != rows:
            raise ValueError(f"part {p} holds {rows} rows, its row groups {sum(sizes)}")
        starts = np.concatenate([[0], np.cumsum(sizes)])
        segments = tuple(
            Segment(p, g, int(starts[g]), sizes[g], 0, key)
            for g in row_group_order(len(sizes), key=key, part=p).tolist()
            if sizes[g]
        )
        units.append(Unit(p, int(rows), segments))
    return units


def cut_units(units: Sequence[Unit], n: int) -> list[list[Unit]]:
    """``units``' rows, in order, as ``n`` consecutive runs even by rows.

    Run ``b`` ends at row ``floor((b + 1) * total / n)``, so runs differ by at most one row; a
    unit a boundary falls in is cut there, each side keeping its segments' order. Units must
    carry their segments (``tail``), as every unit of a mixed leg does.
    """
    if n < 1:
        raise ValueError(f"a cut needs n >= 1 runs, got {n}")
    total = sum(u.rows for u in units)
    ends = [(b + 1) * total // n for b in range(n)]
    out: list[list[Unit]] = [[] for _ in range(n)]
    b = pos = 0
    for u in units:
        if u.tail is None:
            raise ValueError(f"unit of part {u.part} has no segments to cut")
        held: list[Segment] = []
        for seg in u.tail:
            while seg.left:
                while ends[b] == pos:  # this run is full: close the unit's piece in it
                    _close(out[b], u.part, held)
                    b += 1
                m = min(seg.left, ends[b] - pos)
                held.append(dataclasses.replace(seg, stop=seg.skip + m))
                seg = dataclasses.replace(seg, skip=seg.skip + m)
                pos += m
        _close(out[b], u.part, held)
    return out


def _close(run: list[Unit], part: int, held: list[Segment]) -> None:
    if held:
        run.append(Unit(part, sum(s.left for s in held), tuple(held)))
        held.clear()


def stratify(units: Sequence[Unit], n_ranks: int) -> list[list[Unit]]:
    """Each unit cut into one piece per rank: every rank gets a share of every unit.

    Which rank takes which piece turns with the part, so the larger pieces of uneven cuts do
    not all land on the first ranks.
    """
    ranks: list[list[Unit]] = [[] for _ in range(n_ranks)]
    for u in units:
        for r, piece in enumerate(cut_units([u], n_ranks)):
            ranks[(r + u.part) % n_ranks].extend(piece)
    return ranks


def owner_lanes(
    units: Sequence[Unit],
    owner: int,
    n_owners: int,
    workers_per_rank: int,
    *,
    seed: int,
    epoch: int,
    leg: int = 0,
) -> list[list[Unit]]:
    """The lanes owner ``owner`` interleaves in a mixed leg, each a list of units in order.

    A first leg stratifies ``units`` (every rank a piece of every part); a later leg cuts what
    earlier legs left, permuted, contiguously by rows over the ranks. A rank's units are
    permuted, cut over its workers by rows and dealt to the lanes in turn, so a rank's rows
    never depend on its worker count.
    """
    n_ranks = n_owners // workers_per_rank
    rank, worker = divmod(owner, workers_per_rank)
    if leg == 0:
        mine = stratify(units, n_ranks)[rank]
    else:
        order = epoch_rng(seed, epoch, leg).permutation(len(units))
        mine = cut_units([units[i] for i in order], n_ranks)[rank]
    order = np.random.default_rng([seed, epoch, 1 << 32, leg, rank]).permutation(len(mine))
    own = cut_units([mine[i] for i in order], workers_per_rank)[worker]
    return [own[k::LANES] for k in range(LANES)]


def lane_positions(
    lanes: Sequence[Sequence[Unit]],
    part_offsets: Sequence[int] | np.ndarray,
    start: int = 0,
    stop: int | None = None,
    group_rows: GroupRows | None = None,
    key: tuple[int, ...] | None = None,
) -> np.ndarray:
    """Index positions of the interleaved lanes' rows ``[start, stop)``, in stream order.

    Whole parts in a lane are planned with ``group_rows`` and ``key``, as the reading owner
    plans them; a single lane is the owner's plain stream.
    """
    rows = [sum(u.rows for u in lane) for lane in lanes]
    firsts = lane_starts(rows, start)
    streams = [
        segment_positions(unit_segments(lane, group_rows or _no_files, key, first), part_offsets)
        for lane, first in zip(lanes, firsts, strict=True)
    ]
    chunks = interleave(streams, firsts, len, _slice, _merge)
    return first_rows(chunks, None if stop is None else stop - start)


def lane_segments(lane: Sequence[Unit], skip: int) -> Iterator[Segment]:
    """A lane's segments in order, its first ``skip`` rows left out (no file is asked)."""
    return unit_segments(lane, _no_files, None, skip)


def _no_files(part: int) -> Sequence[int]:
    raise AssertionError(f"a mixed unit of part {part} carries its segments")


def _slice(a: np.ndarray, i: int, j: int) -> np.ndarray:
    return a[i:j]


def _merge(chunks: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    return np.concatenate(chunks)[order]
