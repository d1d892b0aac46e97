"""Split whole items into bins even by rows: deterministic, from the row counts alone.

:func:`balance` lays out the iterable reader's parts, first over ranks and then over each rank's
workers (:func:`pipeline.readers.split.parts_by_owner`). It never reads a path or a hash, so
every process computes the same layout.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import numpy as np

#: Bound on the move/swap steps :func:`balance` takes after its greedy pass.
_MAX_STEPS = 256


def balance(rows: Sequence[int], items: Iterable[int], n_bins: int) -> list[list[int]]:
    """Split whole ``items`` (indices into ``rows``) into ``n_bins`` sorted lists, even by rows.

    Greedy longest-processing-time first: items by decreasing rows (ties: lower index) each go to
    the bin with the fewest rows so far (ties: fewer items, so empty items spread out too, then
    lower bin). Then, while it narrows the gap between the heaviest and the lightest bin, one
    item moves from the heaviest to the lightest or two items swap between them. Deterministic
    from the row counts alone; the loads only ever move towards each other, so the spread stays
    within the largest item's rows.
    """
    if n_bins < 1:
        raise ValueError(f"bin count must be >= 1, got {n_bins}")
    order = sorted(items, key=lambda p: (-rows[p], p))
    heap = [(0, 0, b) for b in range(n_bins)]  # (rows, items held, bin)
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    loads = [0] * n_bins
    for p in order:
        load, held, b = heapq.heappop(heap)
        bins[b].append(p)
        loads[b] = load + rows[p]
        heapq.heappush(heap, (loads[b], held + 1, b))
    for _ in range(_MAX_STEPS):  # each step lowers the sum of squared loads, so it ends anyway
        hi = max(range(n_bins), key=lambda b: (loads[b], -b))
        lo = min(range(n_bins), key=lambda b: (loads[b], b))
        step = _narrowing_step(rows, bins[hi], bins[lo], loads[hi] - loads[lo])
        if step is None:
            break
        give, take = step  # give moves hi -> lo; take (or None) moves lo -> hi
        bins[hi].remove(give)
        bins[lo].append(give)
        delta = rows[give]
        if take is not None:
            bins[lo].remove(take)
            bins[hi].append(take)
            delta -= rows[take]
        loads[hi] -= delta
        loads[lo] += delta
    return [sorted(b) for b in bins]


def _narrowing_step(
    rows: Sequence[int], heavy: list[int], light: list[int], gap: int
) -> tuple[int, int | None] | None:
    """The move or swap between two bins that leaves them closest to equal, if any narrows them.

    Moving ``d`` rows from the heavy bin to the light one leaves a gap of ``|gap - 2d|``, which
    is narrower exactly when ``0 < d < gap``. Ties go to a move, then to the lower part index.
    """
    if gap <= 1 or not heavy:
        return None
    h = np.array(sorted(heavy, key=lambda p: (rows[p], p)), dtype=np.int64)
    hv = np.array([rows[p] for p in h], dtype=np.int64)
    best: tuple[int, int, int, int] | None = None  # (new gap, kind, give, take)
    ok = (hv > 0) & (hv < gap)
    if ok.any():
        k = np.flatnonzero(ok)
        scores = np.abs(gap - 2 * hv[k])
        j = k[np.argmin(scores)]
        best = (int(np.abs(gap - 2 * hv[j])), 0, int(h[j]), -1)
    if light:
        lp = np.array(sorted(light, key=lambda p: (rows[p], p)), dtype=np.int64)
        lv = np.array([rows[p] for p in lp], dtype=np.int64)
        # for each heavy item, the light items nearest to (its rows - gap / 2)
        at = np.searchsorted(2 * lv, 2 * hv - gap)
        for cand in (at - 1, at):
            valid = (cand >= 0) & (cand < len(lv))
            if not valid.any():
                continue
            i = np.flatnonzero(valid)
            d = hv[i] - lv[cand[i]]
            good = (d > 0) & (d < gap)
            if not good.any():
                continue
            i = i[good]
            scores = np.abs(gap - 2 * (hv[i] - lv[cand[i]]))
            j = int(np.argmin(scores))
            option = (int(scores[j]), 1, int(h[i[j]]), int(lp[cand[i[j]]]))
            if best is None or option < best:
                best = option
    if best is None or best[0] >= gap:
        return None
    _, kind, give, take = best
    return (give, None) if kind == 0 else (give, take)
