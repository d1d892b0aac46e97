"""Entry point ``torchrun`` launches for training with ``world_size > 1``, reporting through Pipes.

Every rank verifies the bundle with the bundle cache's trust (every rule is checked; only files
the cache cannot vouch for are hashed, so a rank never re-hashes what the chain verified),
rebuilds the index and refuses to train unless its digest is the one the Dagster step was handed.
Each rank trains on its disjoint share; only rank 0 opens the Dagster Pipes channel (one writer
per channel), streams its log lines to the Dagster run and reports the materialization metadata.
The other ranks log to stderr, which the Pipes subprocess client forwards to the run's logs.
This module imports ``dagster_pipes`` (the small, dependency-free protocol package), never
Dagster itself.

    torchrun --nproc-per-node 2 -m pipeline.defs.train_launch \\
        --bundle B --cache-dir C --index-sha256 D --config JSON --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.digest import file_bytes_hashed
from pipeline.readers.index import Index, IndexMismatch
from pipeline.training.fit import TrainConfig, TrainSummary, fit
from pipeline.training.model import save_checkpoint
from resources.bundle_store import BundleStore


def main(argv: list[str] | None = None) -> int:
    """Initialise the process group from torchrun's environment, train, and report from rank 0."""
    p = argparse.ArgumentParser(prog="pipeline.defs.train_launch")
    p.add_argument("--bundle", required=True, help="bundle view in the cache")
    p.add_argument("--cache-dir", required=True, help="the bundle cache that vouches for it")
    p.add_argument("--index-sha256", required=True, help="digest the rebuilt index must have")
    p.add_argument("--config", required=True, help="TrainConfig as JSON")
    p.add_argument("--out", required=True, help="directory for checkpoint + outcome (rank 0)")
    args = p.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with contextlib.ExitStack() as stack:
        pipes = None
        if rank == 0:
            from dagster_pipes import open_dagster_pipes

            pipes = stack.enter_context(open_dagster_pipes())

        def log(msg: str) -> None:
            if pipes is not None:
                pipes.log.info(msg)
            else:
                print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)

        snapshot = BundleStore(args.cache_dir).verify(args.bundle)
        index = Index.from_snapshot(snapshot)
        if index.digest != args.index_sha256:
            raise IndexMismatch(
                f"{args.bundle}: the index rebuilt on rank {rank} is {index.digest}, the step "
                f"was handed {args.index_sha256}"
            )
        # What every rank hashed to verify its input, summed: the cost of the launch itself.
        hashed = torch.tensor([file_bytes_hashed()], dtype=torch.int64)
        dist.all_reduce(hashed)
        config = TrainConfig.model_validate_json(args.config)
        outcome = fit(index, config, rank=rank, world_size=world, log=log)
        if rank == 0:
            out = Path(args.out)
            digest = save_checkpoint(
                out / "model.pt",
                state_dict=outcome.state_dict,
                spec=outcome.spec,
                config=config.model_dump(),
                hidden=config.hidden,
            )
            summary = TrainSummary.of(outcome, digest, world)
            atomic_write_text(out / "outcome.json", summary.model_dump_json(indent=2))
            if pipes is not None:
                pipes.report_asset_materialization(
                    metadata={
                        "world_size": world,
                        "checkpoint_sha256": digest,
                        "holdout_accuracy": outcome.metrics["holdout_accuracy"],
                        "final_loss": outcome.loss_curve[-1],
                        "ranks_bytes_hashed": int(hashed.item()),
                    }
                )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
