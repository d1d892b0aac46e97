"""Launched by ``tests/integration/test_torchrun.py`` under torchrun: stop an epoch by SIGKILL,
resume it.

``--phase stop``: every rank reads ``k`` batches (``first``, ``middle`` or ``last`` of its own
epoch) from a map-style and an iterable loader (2 workers each, several batches a worker
message, so batches are prefetched beyond ``k``), writes what it delivered and each loader's
``state_dict()`` as a checkpoint would, and then rank 1 SIGKILLs itself with both loaders
mid-iteration; torchrun tears rank 0 down. ``--phase resume``: a fresh torchrun builds the same
loaders, ``load_state_dict``s each rank's saved state, reads the rest of the epoch and reconciles
the interrupted and the resumed reads together across ranks, then reads the next epoch whole.
``--phase reshape``: a torchrun of another size (3 ranks, 3 workers each) merges every stopped
rank's state (``merge_states``), reads the rest of the epoch and reconciles it with what the
stopped ranks had delivered (counted on rank 0), as one pass. ``--phase mismatch``: rank 1
builds its loader with another worker count, which every rank must refuse at construction.
Each rank writes its pid to ``pid-<phase>-rank<R>``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from pipeline.bundle.verify import verify
from pipeline.readers.index import Index
from pipeline.readers.loader import make_loader, set_epoch
from pipeline.readers.owner import SplitMismatch
from pipeline.readers.reconcile import Tally, reconcile_distributed
from pipeline.readers.resume import merge_states

EPOCH = 1
STYLES = ("map", "iterable")


#: Every phase's loaders read one order, the same batches, several batches a worker message.
LOADER = {"batch_size": 16, "transfer_batches": 4, "seed": 7, "shuffle": True}


def loader_for(index: Index, style: str, num_workers: int = 2):
    return make_loader(index, style=style, num_workers=num_workers, **LOADER)


def write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # a checkpoint is whole or absent


def stop(index: Index, out: Path, k: str, rank: int) -> None:
    iterators = []  # kept alive: the workers are still prefetching when the rank dies
    for style in STYLES:
        loader = loader_for(index, style)
        set_epoch(loader, EPOCH)
        n = {"first": 1, "middle": len(loader) // 2, "last": len(loader)}[k]
        it = iter(loader)
        batches = [next(it) for _ in range(n)]
        iterators.append(it)
        delivered = {
            "ids": [x for b in batches for x in b[index.id_field]],
            "status": [x for b in batches for x in b["lithi_status"]],
            "batches": n,
        }
        write_json(out / f"stop-{style}-rank{rank}.json", delivered)
        write_json(out / f"state-{style}-rank{rank}.json", loader.state_dict())
    dist.barrier()  # both ranks have saved their checkpoints
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait()  # rank 0 is mid-epoch too when torchrun ends it


def count_stopped(tally: Tally, index: Index, stopped: Path) -> None:
    """Count in ``tally`` what a stopped rank delivered (trained on) before it was killed."""
    before = json.loads(stopped.read_text())
    tally.update({index.id_field: before["ids"], "lithi_status": before["status"]})


def read_rest(loader, index: Index, tally: Tally) -> dict:
    """Read the rest of the epoch into ``tally``: what was read, and the reconciliation of the
    whole pass across ranks."""
    resumed: list[str] = []
    for batch in loader:
        tally.update(batch)
        resumed += batch[index.id_field]
    report = reconcile_distributed(index.manifest, tally.counts, ids=index.ids)
    return {"resumed": resumed, "report": report.as_dict()}


def resume(index: Index, out: Path, rank: int) -> None:
    summary: dict[str, dict] = {}
    for style in STYLES:
        loader = loader_for(index, style)
        loader.load_state_dict(json.loads((out / f"state-{style}-rank{rank}.json").read_text()))
        set_epoch(loader, EPOCH)
        tally = Tally(index.id_field, label=f"rank{rank}")
        count_stopped(tally, index, out / f"stop-{style}-rank{rank}.json")
        summary[style] = read_rest(loader, index, tally)
        set_epoch(loader, EPOCH + 1)
        nxt = Tally(index.id_field, label=f"rank{rank}")
        for batch in loader:
            nxt.update(batch)
        next_report = reconcile_distributed(index.manifest, nxt.counts, ids=index.ids)
        summary[style]["next_epoch"] = next_report.as_dict()
    write_json(out / f"resume-rank{rank}.json", summary)


def reshape(index: Index, out: Path, rank: int) -> None:
    summary: dict[str, dict] = {}
    for style in STYLES:
        stopped = sorted(out.glob(f"state-{style}-rank*.json"))
        merged = merge_states([json.loads(p.read_text()) for p in stopped])
        loader = loader_for(index, style, num_workers=3)
        loader.load_state_dict(merged)
        set_epoch(loader, EPOCH)
        tally = Tally(index.id_field, label=f"rank{rank}")
        if rank == 0:  # what every stopped rank trained on, counted once
            for p in sorted(out.glob(f"stop-{style}-rank*.json")):
                count_stopped(tally, index, p)
        summary[style] = read_rest(loader, index, tally)
    write_json(out / f"reshape-rank{rank}.json", summary)


def mismatch(index: Index, out: Path, rank: int) -> None:
    try:
        loader_for(index, "iterable", num_workers=2 + rank)
    except SplitMismatch as e:
        write_json(out / f"mismatch-rank{rank}.json", {"error": str(e)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phase", choices=["stop", "resume", "reshape", "mismatch"], required=True)
    ap.add_argument("--k", choices=["first", "middle", "last"], default="middle")
    ap.add_argument("--gloo-timeout", type=float, default=30.0)
    args = ap.parse_args()
    # torchrun SIGTERMs the ranks left when one fails: a rank that hangs says where it stood
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    # the test scopes its /dev/shm leftover checks to these processes
    Path(args.out, f"pid-{args.phase}-rank{os.environ['RANK']}").write_text(str(os.getpid()))
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.gloo_timeout))
    rank = dist.get_rank()
    out = Path(args.out)
    index = Index.from_snapshot(verify(args.bundle))
    if args.phase == "stop":
        stop(index, out, args.k, rank)
    elif args.phase == "resume":
        resume(index, out, rank)
    elif args.phase == "reshape":
        reshape(index, out, rank)
    else:
        mismatch(index, out, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
