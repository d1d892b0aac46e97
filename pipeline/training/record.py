"""The records that make a checkpoint reproducible: what data produced it, and what came of it.

A checkpoint without the digest of the data that produced it cannot be reproduced, only
re-attempted. :class:`TrainingRecord` is written once beside the checkpoint and never changed;
the output bundle staged from its predictions gets a record of its own (:class:`OutputRecord`)
that embeds it, so no step ever rewrites another step's artifact.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ConfigDict

from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.manifest import SnapshotId
from pipeline.readers.index import Index
from pipeline.readers.reconcile import ReconcileReport
from pipeline.training.runner import CHECKPOINT_DIR, CheckpointFiles, Resume
from pipeline.training.trainer import FeatureSet, TrainerInfo

RECORD_NAME = "record.json"
__all__ = ["CHECKPOINT_DIR", "RECORD_NAME", "OutputRecord", "TrainedModel", "TrainingRecord"]

M = TypeVar("M", bound=BaseModel)


class TrainingRecord(BaseModel):
    """The experiment record beside the checkpoint: data identity, code, config, outcome."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    snapshot: SnapshotId
    index_sha256: str
    trainer: TrainerInfo
    config: dict[str, Any]
    features: FeatureSet
    world_size: int
    checkpoint: CheckpointFiles
    metrics: dict[str, float]
    loss_curve: list[float]
    reconciliation: ReconcileReport
    passes: int
    resumed: Resume | None = None  # the fit was killed, restarted, and resumed after this step
    device: str = "cpu"  # the device type it trained on; the checkpoint's bytes do not depend on it


class OutputRecord(BaseModel):
    """The record beside an output bundle: the bundle, and the training record it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    output: SnapshotId
    bundle_path: str
    training_record: str
    training: TrainingRecord
    published_url: str | None = None  # where the bundle was also published (LITHI_PUBLISH_URL)
    published_training_url: str | None = None  # where checkpoint, records were published


def write_record(directory: str | os.PathLike, record: BaseModel) -> Path:
    """Write ``record.json`` in ``directory`` atomically (never over an existing one)."""
    path = Path(directory) / RECORD_NAME
    atomic_write_text(path, record_text(record), replace=False)
    return path


def record_text(record: BaseModel) -> str:
    """The exact text a record is written as (what the UI shows is this text, parsed)."""
    return record.model_dump_json(indent=2) + "\n"


@overload
def read_record(path: str | os.PathLike) -> TrainingRecord: ...
@overload
def read_record(path: str | os.PathLike, kind: type[M]) -> M: ...
def read_record(path: str | os.PathLike, kind: type[BaseModel] = TrainingRecord) -> BaseModel:
    """Read a record written by :func:`write_record` as ``kind`` (a training record unless
    told otherwise)."""
    return kind.model_validate_json(Path(path).read_text())


@dataclass(frozen=True, eq=False)
class TrainedModel:
    """What a training run hands on: its folder (checkpoint and record), and the index it read."""

    index: Index
    directory: Path
    record: TrainingRecord

    @property
    def checkpoint_dir(self) -> Path:
        """The files the trainer wrote: exactly what ``record.checkpoint`` hashes."""
        return self.directory / CHECKPOINT_DIR

    @property
    def record_path(self) -> Path:
        """``record.json`` beside the checkpoint directory."""
        return self.directory / RECORD_NAME
