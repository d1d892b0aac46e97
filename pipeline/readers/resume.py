"""Loader states: what one rank saves, how every rank's states merge, what a loader may resume.

A :class:`~pipeline.readers.loader.ReaderLoader` state names one rank's place in its epoch:
the reader's identity (style, order, bundle), its shape (rank, world size, worker-owners), the
epoch's earlier legs and the rows it delivered in the current one. It resumes the same rank at
the same shape. :func:`merge_states` folds the states of every rank of one leg into a state
with no rank, which any shape resumes: the rows not yet delivered are re-split over the new
owners (:mod:`pipeline.readers.reshard`), each delivered exactly once across the legs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.readers.reshard import Leg, legs_from_state
from pipeline.readers.sampler import is_count

#: The layout of a loader state; version 1 (no legs) still loads.
STATE_VERSION = 2
_READS = (1, 2)

#: What a state from before a key existed meant by its absence.
_BEFORE = {"mix": False}

#: Keys that place a one-rank state in its leg; a merged state has none of them.
SHAPE_KEYS = ("rank", "world_size", "num_workers")


class ResumeMismatch(ValueError):
    """A saved loader state belongs to another split, rank or bundle than this loader's."""


def check_version(state: object) -> Mapping[str, Any]:
    """``state`` as a mapping of a layout this version reads, else a clear error."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a loader state is a dict, found {type(state).__name__}")
    if state.get("version") not in _READS:
        raise ResumeMismatch(
            f"loader state version {state.get('version')!r}; this loader reads versions "
            f"{', '.join(map(str, _READS))}"
        )
    return state


def differences(state: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """``key: saved X, this loader Y`` for each key of ``expected`` the state does not match."""
    state = {**_BEFORE, **state}
    return [
        f"{k}: saved {state.get(k)!r}, this loader {v!r}"
        for k, v in expected.items()
        if state.get(k) != v
    ]


def is_merged(state: Mapping[str, Any]) -> bool:
    """Whether ``state`` is a merged state (every rank's, no shape) rather than one rank's."""
    return "rank" not in state


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every rank's loader state, taken after the same step, as one state any shape resumes.

    ``states`` holds one state per rank of one leg (``state_dict()`` of each rank's loader, in
    any order). The result keeps the reader's identity and the epoch, and appends this leg —
    its shape and each owner's delivered rows — to the earlier ones; it has no rank. Load it on
    every rank of the new shape (ranks and workers may both differ). Small: a few ints per
    owner, no ids. Raises :class:`ResumeMismatch` for states of different loaders, epochs or
    legs, or when a rank is missing or repeated.
    """
    if not states:
        raise ValueError("merge_states needs the state of every rank, got none")
    states = [check_version(s) for s in states]
    first = {**_BEFORE, **states[0]}
    if is_merged(first):
        raise ResumeMismatch("merge_states takes one state per rank, not merged states")
    world = first.get("world_size")
    common = {
        k: first.get(k)
        for k in ("style", "shuffle", "mix", "seed", "items", "snapshot", "epoch", "world_size")
    }
    common["num_workers"] = first.get("num_workers")
    common["legs"] = first.get("legs", [])
    for s in states[1:]:
        differ = differences({**s, "legs": s.get("legs", [])}, common)
        if differ:
            raise ResumeMismatch(
                "the states come from different loaders or steps: " + "; ".join(differ)
            )
    ranks = sorted(r if is_count(r := s.get("rank")) else -1 for s in states)
    if not is_count(world) or ranks != list(range(world)):
        raise ResumeMismatch(
            f"merge_states needs one state from each of the {world} rank(s), got ranks {ranks}"
        )
    by_rank = sorted(states, key=lambda s: s["rank"])
    workers = first.get("num_workers")
    owners_per_rank = 1 if first.get("style") == "map" else max(int(workers or 0), 1)
    rows: list[int] = []
    for s in by_rank:
        r = s.get("rows")
        rows.extend([r] if isinstance(r, int) else list(r or []))
    legs = list(legs_from_state(common["legs"]))
    if any(rows):  # a leg that delivered nothing leaves the pool as it was
        legs.append(Leg(world, owners_per_rank, tuple(rows)))
    merged = {k: v for k, v in first.items() if k not in (*SHAPE_KEYS, "rows", "legs")}
    return {**merged, "version": STATE_VERSION, "legs": [leg.to_state() for leg in legs]}
