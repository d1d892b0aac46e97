"""Decoded parts across processes: nothing left after the owner exits or dies, spawned workers.

The owner runs in a child interpreter, so that it can exit or be SIGKILLed for real; spawned
workers are fresh interpreters too. What one process shows is tests/readers/test_partcache.py.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.readers import set_epoch
from pipeline.readers.partcache import PREFIX, ROOT_ENV, sweep_stale
from tests.helpers.readers import (
    UNEVEN_SIZES,
    epoch_batches,
    shared_parts_loader,
)
from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[2]


_OUT = dict(cwd=ROOT, capture_output=True, text=True, timeout=limit(120))


def _run_child(code: str, *args: str, parts: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``code``; with ``parts``, its shared directories go there (``LITHI_SHARED_PARTS_DIR``)
    rather than where any other test's dataset may sweep them."""
    env = {**os.environ, **({ROOT_ENV: str(parts)} if parts else {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, **_OUT)


CHILD = """
    import os, signal, sys
    from pipeline.bundle.verify import verify
    from pipeline.readers import Index, make_loader
    index = Index.from_snapshot(verify(sys.argv[1]))
    loader = make_loader(index, batch_size=16, num_workers=2, seed=3, transfer_batches=4,
                         multiprocessing_context="fork")
    print(loader.dataset.shared.path, flush=True)
    it = iter(loader)
    next(it)
    if sys.argv[2] == "kill-worker":
        # torch's SIGCHLD handler may raise as soon as the first worker dies, still inside the
        # kill loop on a busy machine: the loop belongs inside the try
        try:
            for w in loader.loader._iterator._workers:
                os.kill(w.pid, signal.SIGKILL)
            for _ in it:
                pass
        except RuntimeError as e:  # torch: "DataLoader worker (pid ...) is killed by signal"
            print("worker died:", e, flush=True)
            sys.exit(3)
    if sys.argv[2] == "kill-main":
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in it:
        pass
    # exit with the loader and its workers alive: the interpreter's exit removes the directory
"""


@pytest.mark.durable
@pytest.mark.parametrize("how", ["exit", "kill-worker"])
def test_nothing_is_left_after_the_process_exits(index, how):
    done = _run_child(CHILD, str(index.snapshot.root), how)
    assert done.returncode == (3 if how == "kill-worker" else 0), done.stderr
    path = Path(done.stdout.split()[0])
    assert path.name.startswith(PREFIX)
    if how == "kill-worker":
        assert "worker died" in done.stdout
    assert not path.exists()


@pytest.mark.durable
def test_a_killed_owners_directory_is_swept_by_the_next_one(index, tmp_path):
    done = _run_child(CHILD, str(index.snapshot.root), "kill-main", parts=tmp_path)
    assert done.returncode == -signal.SIGKILL
    path = Path(done.stdout.split()[0])
    assert path.exists()  # nothing runs in a SIGKILLed process...
    assert str(path) in sweep_stale(str(path.parent))  # ...so the next owner removes it
    assert not path.exists()


def test_spawned_workers_share_too_and_never_own_the_directory(index):
    loader = shared_parts_loader(index, transfer_batches=4, multiprocessing_context="spawn")
    private = shared_parts_loader(index, transfer_batches=4, share_decoded=False)
    assert epoch_batches(loader, 1) == epoch_batches(private, 1)
    shared = loader.dataset.shared
    assert shared.published() == list(range(len(UNEVEN_SIZES)))
    path = Path(shared.path)
    set_epoch(loader, 2)  # persistent workers: shut them down by dropping the iterator
    loader.loader._iterator = None
    gc.collect()
    assert path.exists()  # the workers' copies are gone; the owner's directory is not
    del loader, shared
    gc.collect()
    assert not path.exists()
