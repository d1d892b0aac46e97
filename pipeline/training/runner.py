"""The pipeline's side of training: run a trainer, reconcile its passes, hash its checkpoint.

Used the same way by the Dagster step (``world_size`` 1) and by every ``torchrun`` rank, so the
record of a checkpoint never depends on how it was launched. The trainer only trains; what it
iterated is reconciled here, across ranks, and what it wrote is hashed here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict

from pipeline.bundle.atomic import READ_ONLY, atomic_write_text
from pipeline.bundle.digest import content_sha256, sha256_files
from pipeline.readers.index import Index
from pipeline.readers.reconcile import OwnerCounts, ReconcileReport, reconcile_distributed
from pipeline.training.cut_mirror import CutMirror
from pipeline.training.memory import frozen_heap
from pipeline.training.progress import CLAIM_WAIT, Progress
from pipeline.training.trainer import FeatureSet, FitContext, FitResult, Trainer, TrainerError

#: The trainer's files, under a run's folder: exactly what the checkpoint digest covers.
CHECKPOINT_DIR = "checkpoint"
#: The finished run's :class:`TrainSummary`, beside the checkpoint, written last by rank 0.
OUTCOME = "outcome.json"


class CheckpointFiles(BaseModel):
    """Every file a trainer wrote, with its sha256, and one digest over all of them."""

    model_config = ConfigDict(frozen=True)

    files: dict[str, str]
    sha256: str


class Resume(BaseModel):
    """A fit that resumed from a mid-fit cut: the step it resumed after, and the interrupted
    pass reconciled as one (what was delivered before the cut and after it, across ranks)."""

    model_config = ConfigDict(frozen=True)

    step: int
    reconciliation: ReconcileReport
    #: the world size the cut was taken at (the record's ``world_size`` is the resumed one's)
    world_size: int | None = None


@dataclass(frozen=True)
class FitRun:
    """What :func:`run_fit` hands back: ``fit``'s result, the reconciliations, the passes."""

    result: FitResult
    reconciliation: ReconcileReport
    passes: int
    resumed: Resume | None = None
    device: str = "cpu"


class TrainSummary(BaseModel):
    """A finished, checkpointed run as plain data: the same in-process and under torchrun."""

    model_config = ConfigDict(frozen=True)

    metrics: dict[str, float]
    loss_curve: list[float]
    features: FeatureSet
    reconciliation: ReconcileReport
    passes: int
    checkpoint: CheckpointFiles
    world_size: int
    resumed: Resume | None = None
    device: str = "cpu"  # the device type rank 0 trained on ("cpu", "cuda")


def run_fit(
    trainer: Trainer,
    index: Index,
    config: Any,
    *,
    output_dir: Path,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 0,
    log: Callable[[str], None] = print,
    progress_dir: Path | None = None,
    checkpoint_every: int = 0,
    device: torch.device | str = "cpu",
    claim_wait: float = CLAIM_WAIT,
    progress_mirror: CutMirror | None = None,
) -> FitRun:
    """Call ``trainer.fit`` on this rank, then reconcile its last full pass across ranks.

    A collective when ``world_size > 1``: every rank calls it. Returns what ``fit`` reported,
    the reconciliation of the last complete pass over the loaders it was given, and how many
    complete passes it made. With ``progress_dir``, the trainer may save mid-fit cuts there
    every ``checkpoint_every`` steps and resumes from the last one a killed fit left; the
    interrupted pass is then reconciled too, and the cuts are removed once ``fit`` returns.
    ``device`` is this rank's (:func:`~pipeline.training.device.choose_device`). While
    another live process fits on the same cuts, it waits up to ``claim_wait`` seconds for them,
    then refuses (:class:`~pipeline.training.progress.ProgressError`) before any training.
    ``progress_mirror`` keeps the cuts at a URL too, for ranks on machines with no shared disk.
    """
    progress = Progress(
        progress_dir,
        rank=rank,
        world_size=world_size,
        every=checkpoint_every,
        mirror=progress_mirror,
    )
    ctx = FitContext(
        index=index,
        config=trainer.parse_config(config),
        rank=rank,
        world_size=world_size,
        num_workers=num_workers,
        log=log,
        output_dir=output_dir,
        progress=progress,
        device=device,
    )
    with progress.claimed(claim_wait):  # no other process writes or prunes these cuts meanwhile
        with frozen_heap():
            result = trainer.fit(ctx)
        if not isinstance(result, FitResult):
            raise TrainerError(
                f"{type(trainer).__name__}.fit returned {type(result).__name__}, expected FitResult"
            )
        counts = ctx.passes.last or OwnerCounts(label=f"rank {rank}")
        report = reconcile_distributed(
            index.manifest, counts, ids=index.ids, raise_on_mismatch=False
        )
        resumed = None
        if progress.resumed_from is not None:  # the same on every rank: they loaded one cut
            interrupted = ctx.passes.resumed or OwnerCounts(label=f"rank {rank}")
            resumed = Resume(
                step=progress.resumed_from,
                world_size=progress.resumed_world_size,
                reconciliation=reconcile_distributed(
                    index.manifest, interrupted, ids=index.ids, raise_on_mismatch=False
                ),
            )
        progress.clear()
    return FitRun(result, report, ctx.passes.completed, resumed, ctx.device.type)


class FitOptions(TypedDict, total=False):
    """:func:`run_fit`'s keyword arguments but the output directory, as :func:`train_once`
    passes them on."""

    rank: int
    world_size: int
    num_workers: int
    log: Callable[[str], None]
    progress_dir: Path | None
    checkpoint_every: int
    device: torch.device | str
    progress_mirror: CutMirror | None


def train_once(
    trainer: Trainer, index: Index, config: Any, out: Path, **options: Unpack[FitOptions]
) -> TrainSummary | None:
    """One training run into ``out``, the same in a Dagster step and on every torchrun rank.

    The trainer writes into ``out/checkpoint``; once every rank has finished ``fit``, rank 0
    hashes the checkpoint and writes ``out/outcome.json`` (the :class:`TrainSummary`), last, and
    returns the summary; the other ranks return ``None``. A collective when ``world_size > 1``.
    A checkpoint folder without an outcome is what an attempt killed mid-fit left: it is cleared,
    and the fit resumes from its last mid-fit cut and writes the checkpoint afresh.
    """
    out = Path(out)
    rank, world_size = options.get("rank", 0), options.get("world_size", 1)
    checkpoint_dir = out / CHECKPOINT_DIR
    if rank == 0 and checkpoint_dir.exists() and not (out / OUTCOME).exists():
        shutil.rmtree(checkpoint_dir)
    if world_size > 1:
        dist.barrier()  # no rank writes into the folder rank 0 is clearing
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    run = run_fit(trainer, index, config, output_dir=checkpoint_dir, **options)
    if world_size > 1:
        dist.barrier()  # rank 0 hashes the checkpoint only once every rank has finished fit
    if rank != 0:
        return None
    summary = summarize(run, hash_checkpoint(checkpoint_dir), world_size)
    atomic_write_text(out / OUTCOME, summary.model_dump_json(indent=2))
    return summary


def progress_key(index: Index, trainer_path: str, config: Any) -> str:
    """The name of a fit's mid-fit cuts: the same data, code path and config resume each
    other's cuts, on any number of ranks and workers; anything else starts afresh (never a cut
    of another run's data)."""
    ident = {"index_sha256": index.digest, "trainer": trainer_path, "config": config}
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def hash_checkpoint(directory: Path) -> CheckpointFiles:
    """Hash every file under ``directory`` (the trainer's checkpoint) and make them read-only.

    The digest over them is the ``sha256sum`` text of the files in path order, hashed: the same
    rule as a bundle's ``content_sha256``, so ``(cd DIR && sha256sum $(find . -type f | sort))``
    checks it with coreutils.
    """
    paths = sorted(p for p in Path(directory).rglob("*") if p.is_file() and not p.is_symlink())
    if not paths:
        raise TrainerError(f"the trainer wrote no checkpoint file into {directory}")
    rel = [p.relative_to(directory).as_posix() for p in paths]
    digests = sha256_files(paths)
    for p in paths:
        os.chmod(p, READ_ONLY)
    files = dict(zip(rel, digests, strict=True))
    return CheckpointFiles(files=files, sha256=content_sha256((d, r) for r, d in files.items()))


def summarize(run: FitRun, checkpoint: CheckpointFiles, world_size: int) -> TrainSummary:
    """The plain-data summary the record is written from."""
    return TrainSummary(
        metrics={k: float(v) for k, v in run.result.metrics.items()},
        loss_curve=[float(v) for v in run.result.loss_curve],
        features=run.result.features,
        reconciliation=run.reconciliation,
        passes=run.passes,
        checkpoint=checkpoint,
        world_size=world_size,
        resumed=run.resumed,
        device=run.device,
    )
