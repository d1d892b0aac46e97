"""Nothing outlives the process that started it, whatever kills it (SIGKILL included, where
no cleanup code runs): a reader's DataLoader workers die with the reader, and a training step's
torchrun, its ranks (each in a session of its own) and their workers die with the step.

A worker left behind is not just a leak: blocked writing a batch into a pipe nobody reads any
more, it holds the pipe's lock, its siblings wait on it, and none of them ever exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.bundle.stage import stage
from pipeline.readers.index import Index
from pipeline.training.trainer import REFERENCE_TRAINER
from resources.bundle_store import BundleStore
from tests.helpers.timing import limit, wait_until

ROOT = Path(__file__).resolve().parents[2]

#: Rows large enough that two prefetched messages per worker overfill the widened pipe.
ROWS, DIM = 40_000, 64

#: The reader: iterate one batch, note the worker processes, then die by SIGKILL.
READER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from pipeline.bundle.verify import verify
    from pipeline.readers import Index, make_loader

    bundle, style, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    loader = make_loader(
        Index.from_snapshot(verify(bundle)), style=style, batch_size=4096, num_workers=3,
        shuffle=True, seed=1, multiprocessing_context="fork",
    )
    it = iter(loader)
    next(it)
    me = os.getpid()
    kids = [
        k for t in Path(f"/proc/{me}/task").iterdir()
        for k in (t / "children").read_text().split()
    ]
    out.write_text(" ".join(kids))
    os.kill(me, signal.SIGKILL)
    """
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    table = pa.table(
        {
            "item_id": [f"it-{i:06d}" for i in range(ROWS)],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), DIM),
            "label": pa.array(rng.integers(0, 4, ROWS)),
        }
    )
    dest = tmp_path_factory.mktemp("orphans") / "b"
    stage(table, dest, id_field="item_id", kind="input", rows_per_part=10_000)
    return dest


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its exit status is left)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("style", ["map", "iterable"])
def test_a_readers_workers_die_when_it_is_killed(bundle, tmp_path, style):
    pids_file, log = tmp_path / "workers", tmp_path / "reader.log"
    with log.open("w") as err:  # a file, not a pipe: a worker left behind would hold a pipe open
        reader = subprocess.run(
            [sys.executable, "-c", READER, str(bundle), style, str(pids_file)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
            stderr=err,
            timeout=limit(120),
        )
    assert reader.returncode == -signal.SIGKILL, log.read_text()
    workers = [int(p) for p in pids_file.read_text().split()]
    assert len(workers) == 3
    try:
        wait_until(
            lambda: not any(_alive(p) for p in workers),
            timeout=limit(30),
            what=f"the killed reader's workers {workers} ending",
        )
    finally:
        for p in workers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


#: The training step: launch the command tethered, as ``training_run`` launches torchrun.
STEP = textwrap.dedent(
    """
    import json, subprocess, sys
    from pipeline.tethered import tethered
    subprocess.run(tethered(json.loads(sys.argv[1])))
    """
)


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains ``text``: this test's own, nobody else's."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline and _alive(int(proc.name)):
            found.append(int(proc.name))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("kill", ["process-group", "step-alone"])
def test_no_rank_outlives_a_killed_training_step(bundle, tmp_path, kill):
    store = BundleStore(tmp_path / "cache")
    view = store.fetch(str(bundle)).path
    index = Index.from_snapshot(store.verify(view))
    out = tmp_path / "run"
    config = {"features": ["embedding"], "label": "label", "epochs": 1000, "batch_size": 512}
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "2", "-m", "pipeline.defs.train_launch",
        "--bundle", str(view), "--cache-dir", str(store.cache_dir),
        "--index-sha256", index.digest, "--trainer", REFERENCE_TRAINER,
        "--config", json.dumps(config), "--num-workers", "1", "--device", "cpu",
        "--out", str(out),
    ]  # fmt: skip
    log = tmp_path / "step.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with log.open("w") as sink:
        step = subprocess.Popen(
            [sys.executable, "-c", STEP, json.dumps(torchrun)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=sink,
            start_new_session=True,  # its own process group, as a Dagster run's
        )
    try:
        wait_until(
            lambda: log.read_text().count("epoch 1/1000") >= 1,
            timeout=limit(180),
            what="rank 0 finishing its first epoch",
        )
        started = _processes_naming(str(out))
        assert len(started) >= 2 + 2 + 1, started  # torchrun, 2 ranks, their workers
        if kill == "process-group":
            os.killpg(step.pid, signal.SIGKILL)
        else:
            os.kill(step.pid, signal.SIGKILL)
        step.wait(timeout=limit(30))
        wait_until(
            lambda: not _processes_naming(str(out)),
            timeout=limit(30),
            what=f"torchrun, its ranks and their workers {started} ending",
        )
    finally:
        for pid in _processes_naming(str(out)):
            os.kill(pid, signal.SIGKILL)
        if step.poll() is None:
            step.kill()
    assert not (out / "outcome.json").exists()
