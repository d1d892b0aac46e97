"""The pipeline's side of training: run a trainer, reconcile its passes, hash its checkpoint.

Used the same way by the Dagster step (``world_size`` 1) and by every ``torchrun`` rank, so the
record of a checkpoint never depends on how it was launched. The trainer only trains; what it
iterated is reconciled here, across ranks, and what it wrote is hashed here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline.bundle.digest import content_sha256, sha256_files
from pipeline.readers.index import Index
from pipeline.readers.reconcile import OwnerCounts, ReconcileReport, reconcile_distributed
from pipeline.training.trainer import FeatureSet, FitContext, FitResult, Trainer, TrainerError


class CheckpointFiles(BaseModel):
    """Every file a trainer wrote, with its sha256, and one digest over all of them."""

    model_config = ConfigDict(frozen=True)

    files: dict[str, str]
    sha256: str


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
) -> tuple[FitResult, ReconcileReport, int]:
    """Call ``trainer.fit`` on this rank, then reconcile its last full pass across ranks.

    A collective when ``world_size > 1``: every rank calls it. Returns what ``fit`` reported,
    the reconciliation of the last complete pass over the loaders it was given, and how many
    complete passes it made.
    """
    ctx = FitContext(
        index=index,
        config=trainer.parse_config(config),
        rank=rank,
        world_size=world_size,
        num_workers=num_workers,
        log=log,
        output_dir=output_dir,
    )
    result = trainer.fit(ctx)
    if not isinstance(result, FitResult):
        raise TrainerError(
            f"{type(trainer).__name__}.fit returned {type(result).__name__}, expected FitResult"
        )
    counts = ctx.passes.last or OwnerCounts(label=f"rank {rank}")
    report = reconcile_distributed(index.manifest, counts, ids=index.ids, raise_on_mismatch=False)
    return result, report, ctx.passes.completed


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
        os.chmod(p, 0o444)
    files = dict(zip(rel, digests, strict=True))
    return CheckpointFiles(files=files, sha256=content_sha256((d, r) for r, d in files.items()))


def summarize(
    result: FitResult,
    report: ReconcileReport,
    passes: int,
    checkpoint: CheckpointFiles,
    world_size: int,
) -> TrainSummary:
    """The plain-data summary the record is written from."""
    return TrainSummary(
        metrics={k: float(v) for k, v in result.metrics.items()},
        loss_curve=[float(v) for v in result.loss_curve],
        features=result.features,
        reconciliation=report,
        passes=passes,
        checkpoint=checkpoint,
        world_size=world_size,
    )
