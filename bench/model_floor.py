"""The model's training step where the chain's training runs it: beside a reader, and in ranks.

``bench/chain.py`` times the trained model alone on one core (``model_rates``). Training's floor
needs two more figures, both of the model's own arithmetic with no data read in the timed
process:

* **beside a reader**: the same step while a loader pass runs in another process. At world
  size 1 the fit's DataLoader worker reads on the other core throughout the epoch, and the two
  share the machine's caches and memory bandwidth, so the step is slower than alone.
* **in ranks**: at world size 2 or more, every rank stepping under DistributedDataParallel on
  its own batch, with the gradients averaged after each backward as the fit averages them (in
  shared memory where the ranks share the host, ``pipeline.training.host_allreduce``). The ranks
  of the bench's training share this machine, so this is what an epoch costs before any data is
  read.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What the reader beside the step runs: the loader pass of ``chain.measure_limits`` at the
#: bench's batch size, repeated until it is stopped. It says ``reading`` once its first batch is in.
_READER = """
import sys
sys.path.insert(0, sys.argv[1])
from pipeline.bundle.verify import verify
from pipeline.readers.index import Index
from pipeline.readers.loader import make_loader

index = Index.from_snapshot(verify(sys.argv[2]))
loader = make_loader(
    index, style="iterable", batch_size=int(sys.argv[3]), num_workers=0, shuffle=True
)
said = False
while True:
    for _ in loader:
        if not said:
            print("reading", flush=True)
            said = True
"""


def train_step(model, spec, batch_size: int, net=None) -> Callable[[], None]:
    """One training step of ``model`` (forward, loss, backward, Adam) on a batch in memory, with
    Adam fused as the fit runs it on the CPU; ``net`` is what computes (a DDP wrapper)."""
    import torch

    x = torch.randn(batch_size, spec.dim)
    y = torch.randint(0, max(spec.outputs, 1), (batch_size,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    forward = net if net is not None else model.net

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = forward(x)
        loss = torch.nn.functional.cross_entropy(out, y) if spec.outputs > 1 else out.mean()
        loss.backward()
        opt.step()

    return step


def best_seconds(fn: Callable[[], None], steps: int, *, sync: Callable[[], None] = lambda: None):
    """The best of three timings of ``steps`` calls of ``fn``, after ten to warm up."""
    for _ in range(10):  # the allocator, the kernels, gloo's first buffers
        fn()
    best = math.inf
    for _ in range(3):
        sync()
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


@contextmanager
def reading_beside(bundle: Path, batch_size: int = 1024) -> Iterator[subprocess.Popen]:
    """A loader pass over ``bundle`` in batches of ``batch_size`` running in another process
    meanwhile (the process), started before the body runs and stopped after it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(ROOT), str(bundle), str(batch_size)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # until the reader's first batch, or its exit
        if line.strip() != "reading":
            raise RuntimeError(f"the reader beside the step did not start (exit {proc.poll()})")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def ranks_rows_per_s(checkpoint: Path, batch_size: int, world: int, steps: int = 200) -> float:
    """Rows per second of ``world`` ranks stepping together under DDP over gloo, each on its own
    ``batch_size`` rows in memory, at the intra-op threads the fit gives a rank with no worker."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "rate"
        mp.start_processes(
            _rank,
            args=(str(checkpoint), batch_size, world, steps, str(store), str(out)),
            nprocs=world,
            start_method="spawn",
        )
        return float(out.read_text())


def _rank(rank, checkpoint, batch_size, world, steps, store, out) -> None:
    import torch
    import torch.distributed as dist

    from pipeline.training.denormals import flushed_denormals
    from pipeline.training.host_allreduce import attach_host_allreduce
    from pipeline.training.model import load_checkpoint
    from pipeline.training.threads import intra_op_threads

    torch.set_num_threads(intra_op_threads(world, 0))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model, spec = load_checkpoint(checkpoint)
        net = torch.nn.parallel.DistributedDataParallel(model.net)
        attach_host_allreduce(net, model.net)  # as the fit does on the CPU
        step = train_step(model, spec, batch_size, net=net)
        with flushed_denormals():  # as the fit computes
            seconds = best_seconds(step, steps, sync=dist.barrier)
        if rank == 0:
            tmp = Path(out).with_suffix(".tmp")
            tmp.write_text(repr(world * steps * batch_size / seconds))
            os.replace(tmp, out)
    finally:
        dist.destroy_process_group()
