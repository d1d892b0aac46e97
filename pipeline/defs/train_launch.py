"""Entry point ``torchrun`` launches for training with ``world_size > 1``, reporting through Pipes.

Every rank verifies the bundle with the bundle cache's trust (by the receipt the chain's
verification left, else every rule, hashing only files the cache cannot vouch for), loads the
saved index (``--index``; rebuilt from the bundle where that file is not on the rank's machine)
and refuses to train unless its digest is the one the Dagster step was handed.
Then every rank runs the same trainer (any :class:`~pipeline.training.Trainer`, by import path)
on its disjoint share, the pipeline reconciles the passes across ranks, and rank 0 hashes the
checkpoint and writes the outcome. Only rank 0 opens the Dagster Pipes channel (one writer per
channel): its log lines and metadata reach the Dagster run; the other ranks log to stderr, which
the Pipes subprocess client forwards. This module imports ``dagster_pipes`` (the small,
dependency-free protocol package), never Dagster itself.

Each rank trains on its device (``--device``: ``auto`` is ``cuda:LOCAL_RANK`` when CUDA is
available, else the CPU) and joins the process group with the backend for it: gloo on the CPU,
NCCL for CUDA tensors beside gloo for CPU ones on a GPU.

When a rank dies, torchrun (``--max-restarts``) restarts every rank; they find the last mid-fit
cut in ``--progress-dir`` and resume there, and the outcome names the step they resumed after.

    torchrun --nproc-per-node 2 --max-restarts 1 -m pipeline.defs.train_launch --bundle B \\
        --cache-dir C --index-sha256 D --trainer pkg.mod:Trainer --config JSON \\
        --progress-dir P --checkpoint-every 200 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pipeline.bundle.contents import ids_decoded
from pipeline.bundle.digest import file_bytes_hashed
from pipeline.readers.index import Index, IndexMismatch
from pipeline.tethered import die_with_parent
from pipeline.training.device import choose_device, process_group_backend
from pipeline.training.runner import train_once
from pipeline.training.trainer import load_trainer
from resources.bundle_store import BundleStore

if TYPE_CHECKING:
    from dagster_pipes import PipesContext


def _init_process_group(device: torch.device) -> None:
    """Join the process group for ``device`` (gloo on the CPU; NCCL for CUDA tensors and gloo
    for CPU ones on a GPU) through torchrun's store, under a prefix of this restart's own.

    torchrun keeps its store across restarts; the default group's keys (each rank's gloo
    address among them) would then still hold the killed attempt's values, and a restarted rank
    could read a dead peer's address before the live one is written: "Connection refused", or a
    connect that waits for its timeout. A prefix per restart (``TORCHELASTIC_RESTART_COUNT``)
    makes every attempt rendezvous on keys only it writes.
    """
    store, rank, world = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"lithi/attempt-{attempt}", store)
    backend = process_group_backend(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)


def launched_by_dagster() -> bool:
    """Whether Dagster Pipes launched this process (its context is in the environment).

    Launched by hand or by a cluster scheduler (the other nodes of a multi-node run), opening
    Pipes would return a no-op mock that swallows rank 0's log lines; rank 0 logs to stderr then.
    """
    from dagster_pipes import PipesEnvVarParamsLoader

    return PipesEnvVarParamsLoader().is_dagster_pipes_process()


def _restart_follows() -> bool:
    """Whether torchrun restarts the ranks if this attempt fails (it has restarts left)."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return attempt < int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))


@contextlib.contextmanager
def _pipes_channel() -> Iterator[PipesContext]:
    """Rank 0's Pipes channel, closed when the attempt succeeds or no restart follows it.

    One channel serves every attempt of a launch. A failed attempt that torchrun restarts
    must not close it: Dagster would take its "closed" for the end, and every message of the
    restarted attempt would then arrive as a warning ("unexpected message received after
    closed"). Its error still reaches the run, through stderr.
    """
    from dagster_pipes import open_dagster_pipes

    pipes = open_dagster_pipes()
    try:
        yield pipes
    except BaseException as e:
        if not _restart_follows():
            pipes.__exit__(type(e), e, e.__traceback__)  # the final attempt: close with its error
        raise
    pipes.close()


def main(argv: list[str] | None = None) -> int:
    """Initialise the process group from torchrun's environment, train, and report from rank 0."""
    p = argparse.ArgumentParser(prog="pipeline.defs.train_launch")
    p.add_argument("--bundle", required=True, help="bundle view in the cache")
    p.add_argument("--cache-dir", required=True, help="the bundle cache that vouches for it")
    p.add_argument(
        "--rehash", action="store_true", help="trust no cache ledger: hash every file again"
    )
    p.add_argument("--index-sha256", required=True, help="digest the index must have")
    p.add_argument(
        "--index", help="the saved index to load (else it is rebuilt from the bundle's ids)"
    )
    p.add_argument("--trainer", required=True, help="import path of the Trainer (pkg.mod:Name)")
    p.add_argument("--config", required=True, help="the trainer's config as a JSON object")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument(
        "--device",
        default="auto",
        help="auto (cuda:LOCAL_RANK if CUDA is available), cpu, cuda[:N]",
    )
    p.add_argument("--progress-dir", help="where mid-fit cuts are saved and resumed from")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between cuts")
    p.add_argument("--out", required=True, help="the run's folder: checkpoint/ and the outcome")
    args = p.parse_args(argv)

    # torchrun starts each rank in a session of its own: without this, a rank whose torchrun
    # was killed would train on, write into a dead run's folder and prune its cuts.
    die_with_parent()
    device = choose_device(args.device)  # cuda:LOCAL_RANK on a GPU machine
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives and DDP use the current device
    _init_process_group(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    with contextlib.ExitStack() as stack:
        pipes = None
        if rank == 0 and launched_by_dagster():
            pipes = stack.enter_context(_pipes_channel())

        def log(msg: str) -> None:
            if pipes is not None:
                pipes.log.info(msg)
            else:
                print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)

        snapshot = BundleStore(args.cache_dir, rehash=args.rehash).verify(args.bundle)
        if args.index and Path(args.index).is_file():  # another node may not have it
            index = Index.load(args.index, snapshot=snapshot)
        else:
            index = Index.from_snapshot(snapshot)
        if index.digest != args.index_sha256:
            raise IndexMismatch(
                f"{args.index or args.bundle}: the index on rank {rank} is {index.digest}, the "
                f"step was handed {args.index_sha256}"
            )
        log(f"rank {rank} of {world} on {device}: index {index.digest[:12]} verified")
        # What every rank hashed and decoded to load its input, summed: the launch's own cost
        # (a receipt and a saved index make both 0).
        sha = snapshot.identity.content_sha256
        cost = torch.tensor([file_bytes_hashed(), ids_decoded(sha)], dtype=torch.int64)
        dist.all_reduce(cost)
        hashed, decoded = (int(v) for v in cost.tolist())
        summary = train_once(
            load_trainer(args.trainer),
            index,
            json.loads(args.config),
            Path(args.out),
            rank=rank,
            world_size=world,
            num_workers=args.num_workers,
            log=log,
            progress_dir=Path(args.progress_dir) if args.progress_dir else None,
            checkpoint_every=args.checkpoint_every,
            device=device,
        )
        if summary is not None:  # rank 0
            if pipes is not None:
                pipes.report_asset_materialization(
                    metadata={
                        "world_size": world,
                        "checkpoint_sha256": summary.checkpoint.sha256,
                        "ranks_bytes_hashed": hashed,
                        "ranks_ids_decoded": decoded,
                    }
                )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
