"""DDP's gradient average through shared memory: the same training as gloo's, in real processes.

Each test starts its ranks with ``torch.multiprocessing`` in a gloo group over a FileStore; the
ranks write what they found to a file the test reads.
"""

from __future__ import annotations

import json
import os
import platform
import re
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pipeline.training.host_allreduce import (
    IN_ORDER_STORES,
    SHM_DIR,
    HostAllReduce,
    HostAllReduceError,
    attach_host_allreduce,
)

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in IN_ORDER_STORES or not SHM_DIR.is_dir(),
    reason="LOUD SKIP: the shared-memory average runs on x86-64 Linux only; elsewhere gloo "
    "averages and these tests have nothing to check",
)

STEPS = 12


def _batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g))
        for _ in range(steps)
    ]


def _trainings(rank: int, world: int, runs: list[dict]) -> list[dict]:
    """Each of ``runs`` in turn, in the one process group: what the rank ends each with."""
    return [_train(rank, world, **run) for run in runs]


def _train(rank: int, world: int, hook: str, shm_dirs: list[str], steps: list[int]) -> dict:
    """DDP over a small MLP, each rank on its own batches; what the rank ends with."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    ddp = nn.parallel.DistributedDataParallel(model)
    said, state = "no hook asked", None
    if hook == "shm":
        state, said = attach_host_allreduce(ddp, model, shm_dir=Path(shm_dirs[rank]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.distributed.algorithms.Join([ddp], enable=len(set(steps)) > 1):
        for x, y in _batches(rank, steps[rank]):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    left = sorted(os.listdir(shm_dirs[rank]))
    if state is not None:
        state.close()
    return {
        "attached": state is not None,
        "said": said,
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
        "left_in_shm_dir": [n for n in left if n.startswith("lithi-ddp-")],
    }


def _rank_main(rank: int, world: int, store: str, out: str, task: str, args: dict) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        if task == "train":
            found = _trainings(rank, world, **args)
        else:
            found = _wait_alone(rank, world, **args)
    finally:
        dist.destroy_process_group()
    Path(f"{out}.{rank}").write_text(json.dumps(found))


def _wait_alone(rank: int, world: int, shm_dir: str, rank_1: str) -> dict:
    """Rank 0 averages a bucket rank 1 never sends: rank 1 ``lives`` on (then rank 0 must give
    up at the timeout) or ``dies`` (then at once, long before it), and rank 0 names rank 1."""
    model = nn.Linear(4, 4)
    ddp = nn.parallel.DistributedDataParallel(model)
    timeout = timedelta(seconds=1 if rank_1 == "lives" else 3600)
    state, _ = attach_host_allreduce(ddp, model, shm_dir=Path(shm_dir), timeout=timeout)
    assert isinstance(state, HostAllReduce)
    if rank == 1 and rank_1 == "dies":
        os._exit(0)  # no goodbye to anyone: the kernel drops its lock as it ends
    error = ""
    if rank == 0:
        try:
            state.average(torch.ones(4))
        except HostAllReduceError as e:
            error = str(e)
    if rank_1 == "lives":
        dist.barrier()
    state.close()
    return {"error": error}


def _run(tmp_path: Path, world: int, task: str, **args) -> list[dict]:
    out = tmp_path / f"found-{task}-{len(list(tmp_path.iterdir()))}"
    store = tmp_path / f"{out.name}.store"
    mp.start_processes(
        _rank_main,
        args=(world, str(store), str(out), task, args),
        nprocs=world,
        start_method="spawn",
    )
    found = [Path(f"{out}.{r}") for r in range(world)]
    return [json.loads(f.read_text()) if f.exists() else {} for f in found]


def test_the_shared_memory_average_trains_as_gloo_does_and_leaves_nothing_behind(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    runs = [
        {"hook": hook, "shm_dirs": [str(shm)] * 2, "steps": steps}
        for steps in ([STEPS, STEPS], [STEPS, STEPS - 5])  # even, then uneven under Join
        for hook in ("none", "shm")
    ]
    found = _run(tmp_path, 2, "train", runs=runs)
    for even_or_not in (0, 2):
        gloo = [rank[even_or_not] for rank in found]
        ours = [rank[even_or_not + 1] for rank in found]
        assert all(r["attached"] for r in ours), ours[0]["said"]
        assert ours[0]["said"] == "gradients averaged in shared memory (2 ranks on one host)"
        # every replica the same, bit for bit, and the same as gloo's (two addends: one sum);
        # the ranks train on different batches, so an average left undone splits the replicas
        assert ours[0]["params"] == ours[1]["params"]
        assert ours[0]["params"] == gloo[0]["params"]
        assert ours[0]["left_in_shm_dir"] == []
    assert list(shm.iterdir()) == []


def test_three_ranks_average_alike(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    runs = [
        {"hook": hook, "shm_dirs": [str(shm)] * 3, "steps": [STEPS] * 3} for hook in ("none", "shm")
    ]
    (gloo, ours), *others = _run(tmp_path, 3, "train", runs=runs)
    assert ours["attached"]
    assert ours["params"] == others[0][1]["params"] == others[1][1]["params"]
    for mine, theirs in zip(ours["params"], gloo["params"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-5, abs=1e-7)


def test_a_rank_that_cannot_map_the_segment_leaves_every_rank_on_gloo(tmp_path):
    """Rank 1 looks in another folder, as a rank on another host would: neither rank uses it."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    runs = [
        {"hook": "shm", "shm_dirs": [str(here), str(elsewhere)], "steps": [STEPS] * 2},
        {"hook": "none", "shm_dirs": [str(here)] * 2, "steps": [STEPS] * 2},
    ]
    (ours0, gloo), (ours1, _) = _run(tmp_path, 2, "train", runs=runs)
    assert [ours0["attached"], ours1["attached"]] == [False, False]
    assert ours0["said"] == ours1["said"]
    assert "gloo: rank 1: " in ours0["said"] and "another host" in ours0["said"]
    assert ours0["params"] == gloo["params"] == ours1["params"]
    assert list(here.iterdir()) == []


def test_a_rank_left_waiting_gives_up_at_the_timeout_naming_who_is_missing(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    found = _run(tmp_path, 2, "wait", shm_dir=str(shm), rank_1="lives")
    # not before the timeout (1 s), and however long a busy machine kept it past that
    said = re.fullmatch(
        r"rank 0 waited (\d+) s for rank 1 to reach gradient step 1", found[0]["error"]
    )
    assert said and int(said[1]) >= 1, found[0]["error"]


def test_a_rank_that_ends_is_an_error_at_once_for_the_rank_waiting_on_it(tmp_path):
    """As gloo's socket closing is: a lost node's or a SIGKILLed rank's peers must not wait out
    the process group's timeout (half an hour by default) before torchrun can restart them."""
    shm = tmp_path / "shm"
    shm.mkdir()
    found = _run(tmp_path, 2, "wait", shm_dir=str(shm), rank_1="dies")
    assert found[1] == {}  # rank 1 ended without a word
    assert found[0]["error"].startswith("rank 1 ended while rank 0 waited")
