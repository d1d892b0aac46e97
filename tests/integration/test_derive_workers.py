"""A derive function runs in the DataLoader worker processes, not in the process that steps:
with the iterable reader's workers (forked each epoch) and the map-style reader's persistent
ones, which ``set_derive`` stops so the next epoch's workers hold the new function."""

from __future__ import annotations

import os

import pytest
import torch

from pipeline.readers import make_loader, set_epoch
from pipeline.readers.derive import Summary


def pid_and_doubled(batch) -> dict[str, torch.Tensor]:
    rows = len(batch["x"])
    return {"__pid": torch.full((rows,), os.getpid()), "__x2": batch["x"] * 2}


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_derive_runs_in_the_workers_and_reaches_persistent_ones(index, style):
    # one batch a message, so both workers have messages to derive
    kw = dict(style=style, batch_size=32, seed=7, transfer_batches=1)
    loader = make_loader(index, num_workers=2, multiprocessing_context="fork", **kw)
    plain = make_loader(index, num_workers=0, **kw)
    set_epoch(loader, 1)
    assert all("x" in b for b in loader)  # an epoch read as it is: map-style workers now run
    loader.set_derive(pid_and_doubled)
    set_epoch(loader, 2)
    set_epoch(plain, 2)
    derived = {int(p): x2 for b in loader for p, x2 in zip(b["__position"], b["__x2"], strict=True)}
    pids = set()
    for b in loader:  # epoch 2 again: the same rows, and the processes that derived them
        pids.update(int(p) for p in b["__pid"])
    expected = {int(p): x * 2 for b in plain for p, x in zip(b["__position"], b["x"], strict=True)}
    assert derived.keys() == expected.keys() and len(derived) == len(index)
    assert all(torch.equal(derived[p], expected[p]) for p in expected)
    assert os.getpid() not in pids and len(pids) == 2  # the two workers, not this process


def pid_and_sum(batch) -> dict:
    return {"__sum": Summary((os.getpid(), len(batch["x"]), float(batch["x"].sum())))}


@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_summary_is_made_in_the_workers_and_crosses_to_this_process(index, style):
    kw = dict(style=style, batch_size=16, seed=4, transfer_batches=2)
    loader = make_loader(
        index, num_workers=2, multiprocessing_context="fork", derive=pid_and_sum, **kw
    )
    plain = make_loader(index, num_workers=0, **kw)
    loader.set_batch_size(loader.message_rows)
    set_epoch(loader, 1)
    set_epoch(plain, 1)
    made = [b["__sum"].value for b in loader]
    assert {pid for pid, _, _ in made} - {os.getpid()} == {pid for pid, _, _ in made}
    assert len({pid for pid, _, _ in made}) == 2
    assert sum(n for _, n, _ in made) == len(index)
    assert sum(s for _, _, s in made) == pytest.approx(sum(float(b["x"].sum()) for b in plain))
