"""Stop an epoch after k batches and resume it from the loader's state: the check shared by the
in-process resume tests (tests/readers/test_resume.py) and the ones with more worker processes
(tests/integration/test_loader_workers.py)."""

from __future__ import annotations

import json
import pickle
import warnings
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.readers import (
    IdleOwnerWarning,
    Index,
    Owner,
    PartIterableDataset,
    ReaderLoader,
    make_loader,
    merge_states,
    set_epoch,
)
from pipeline.readers._progress import IterableProgress
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


# -- resuming at another shape ------------------------------------------------------------------


class WorkersInProcess:
    """What a ``DataLoader`` with ``num_workers`` iterable workers yields, in one process.

    Each worker iterates its own copy of the dataset (pickled when the epoch starts, as a worker
    process gets it) as its worker-owner, and batches arrive round-robin over the workers still
    running, as torch's in-order loader delivers them. It lets a test walk every shape of ranks x
    workers quickly; tests/integration/test_loader_workers.py resumes with real worker processes.
    """

    def __init__(self, dataset: PartIterableDataset, num_workers: int) -> None:
        self.dataset = dataset
        self.num_workers = num_workers

    def __iter__(self):
        ds = self.dataset
        owners = [
            Owner(ds.rank, ds.world_size, w, self.num_workers) for w in range(self.num_workers)
        ]
        copies = [pickle.loads(pickle.dumps(ds)) for _ in owners]
        running = [_tagged(c, o) for o, c in zip(owners, copies, strict=True)]
        while running:
            for it in list(running):
                try:
                    yield next(it)
                except StopIteration:
                    running.remove(it)


def _tagged(dataset: PartIterableDataset, owner: Owner):
    for wire in dataset.iter_owner(owner, wire=True):
        yield owner.worker, wire


def shape_loader(
    index: Index,
    style: str,
    rank: int,
    world: int,
    workers: int,
    *,
    real: bool = False,
    mix: bool = False,
) -> ReaderLoader:
    """Rank ``rank`` of ``world``'s loader of 16-row batches: with ``real``, ``workers`` worker
    processes; else its workers run in this process (none for map-style, whose workers only
    fetch what the rank's sampler hands out)."""
    if real or style == "map" or workers == 0:
        n = workers if real else 0
        kw = dict(style=style, num_workers=n, rank=rank, world_size=world, mix=mix)
        return resume_loader(index, **kw)
    ds = PartIterableDataset(
        index,
        batch_size=16,
        shuffle=True,
        seed=7,
        rank=rank,
        world_size=world,
        num_workers=workers,
        mix=mix,
    )
    return ReaderLoader(WorkersInProcess(ds, workers), 16, IterableProgress(ds))


def cut_and_reshape(
    index: Index,
    style: str,
    before: tuple[int, int],
    after: tuple[int, int],
    k: str,
    *,
    real: bool = False,
    mix: bool = False,
):
    """Every rank of shape ``before`` stops at batch ``k``; shape ``after`` reads the rest.

    Returns the ids delivered before the cut and after it, and the merged state (as JSON).
    """
    world, workers = before
    head: list[str] = []
    states = []
    for rank in range(world):
        loader = shape_loader(index, style, rank, world, workers, real=real, mix=mix)
        set_epoch(loader, EPOCH)
        n = where(k, len(loader))
        it = iter(loader)
        head += [x for _ in range(n) for x in next(it)["item_id"]]
        states.append(json.loads(json.dumps(loader.state_dict())))
    merged = json.loads(json.dumps(merge_states(states)))
    world, workers = after
    tail: list[str] = []
    counted: list[str] = []
    for rank in range(world):
        loader = shape_loader(index, style, rank, world, workers, real=real, mix=mix)
        loader.load_state_dict(merged)
        set_epoch(loader, EPOCH)
        counted += index.ids.take(loader.delivered_positions()).to_pylist()
        tail += [x for b in loader for x in b["item_id"]]
    assert sorted(counted) == sorted(head)  # the merged state names what was delivered, once
    return head, tail, merged
