"""One in-process fit as the pipeline runs it, in its own process so a test can SIGKILL it.

``python -m tests.helpers.fit_once BUNDLE OUT PROGRESS CONFIG_JSON EVERY``: verify the bundle,
build the index, ``run_fit`` the trainer ``$FIT_TRAINER`` (default the reference) with mid-fit
cuts in PROGRESS every EVERY steps, hash the checkpoint under OUT and write the summary there.
Under torchrun (``WORLD_SIZE`` > 1) every rank fits its share in a gloo group and rank 0 writes
the summary.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.verify import verify
from pipeline.readers.index import Index
from pipeline.training import REFERENCE_TRAINER, hash_checkpoint, load_trainer, run_fit
from pipeline.training.runner import summarize


def main(bundle: str, out: str, progress: str, config: str, every: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0"))
    index = Index.from_snapshot(verify(bundle))
    trainer = load_trainer(os.environ.get("FIT_TRAINER", REFERENCE_TRAINER))
    checkpoint = Path(out) / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    run = run_fit(
        trainer,
        index,
        json.loads(config),
        output_dir=checkpoint,
        log=lambda _: None,
        progress_dir=Path(progress),
        checkpoint_every=int(every),
        rank=rank,
        world_size=world,
    )
    if world > 1:
        dist.barrier()  # every rank has finished before rank 0 hashes the checkpoint
        dist.destroy_process_group()
    if rank == 0:
        summary = summarize(run, hash_checkpoint(checkpoint), world)
        atomic_write_text(Path(out) / "summary.json", summary.model_dump_json(indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:])
