"""Stop an epoch after k batches and resume it from the loader's state: the check shared by the
in-process resume tests (tests/readers/test_resume.py) and the ones with more worker processes
(tests/integration/test_loader_workers.py)."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.readers import IdleOwnerWarning, Index, ReaderLoader, make_loader, set_epoch
from tests.helpers.bundles import make_bundle, row_groups_of

SIZES = [1, 300, 2, 250, 100, 199, 157]  # 1,009 items in 7 uneven parts
ROW_GROUP = 64  # several row groups per part, so a resume point can fall inside one
EPOCH = 3


def resume_index(root: Path) -> Index:
    """The 1,009-item bundle in parts of several row groups each, staged under ``root``."""
    with row_groups_of(ROW_GROUP):
        snap = make_bundle(root, SIZES)
    assert pq.ParquetFile(snap.part_paths()[1]).num_row_groups == 5
    return Index.from_snapshot(snap)


def resume_loader(index: Index, **kw) -> ReaderLoader:
    """A shuffled loader of 16-row batches (forked workers unless ``num_workers=0``)."""
    args = dict(batch_size=16, seed=7, shuffle=True, multiprocessing_context="fork")
    args.update(kw)
    if args.get("num_workers", 2) == 0:
        args.pop("multiprocessing_context")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IdleOwnerWarning)
        return make_loader(index, **args)


def batch_ids(batches) -> list[tuple[str, ...]]:
    """Each batch's ids, in order."""
    return [tuple(b["item_id"]) for b in batches]


def stop_and_resume(index: Index, k: int, **kw) -> tuple[list, list, dict]:
    """k batches from one loader, then the rest from a fresh loader restored from its state."""
    first = resume_loader(index, **kw)
    set_epoch(first, EPOCH)
    it = iter(first)
    head = batch_ids(next(it) for _ in range(k))
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint holds
    del it, first  # the workers go, with whatever they had prefetched
    second = resume_loader(index, **kw)
    second.load_state_dict(state)
    set_epoch(second, EPOCH)  # the usual restart: the saved epoch again
    # the state names exactly what was delivered, without reading any data
    before = index.ids.take(second.delivered_positions()).to_pylist()
    assert sorted(before) == sorted(x for b in head for x in b)
    tail = batch_ids(second)
    return head, tail, state


def where(k: str, n: int) -> int:
    """The batch count ``k`` names in an epoch of ``n`` batches."""
    return {"first": 1, "middle": n // 2, "last": n}[k]


def check_every_rank(index, style, workers, transfer, k, *, world):
    """Stop every rank's epoch at ``k`` and resume it: exactly the rest, nothing twice or lost."""
    everything: list[str] = []
    for rank in range(world):
        kw = dict(style=style, num_workers=workers, transfer_batches=transfer)
        kw.update(rank=rank, world_size=world)
        whole = resume_loader(index, **kw)
        set_epoch(whole, EPOCH)
        full = batch_ids(whole)
        assert len(whole) == len(full)
        n = where(k, len(full))
        head, tail, state = stop_and_resume(index, n, **kw)
        assert head == full[:n]
        if style == "map":  # the sampler's order, cut at the same places
            assert tail == full[n:]
        else:  # the same batches; only the interleaving of worker-owners may differ
            assert Counter(tail) == Counter(full[n:])
        assert len(json.dumps(state)) < 600  # offsets, not ids
        ids = [x for b in head + tail for x in b]
        assert len(ids) == len(set(ids))  # none twice
        assert sorted(ids) == sorted(x for b in full for x in b)  # none lost
        everything += ids
    assert sorted(everything) == index.ids.to_pylist()
