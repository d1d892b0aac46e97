"""The record written beside every checkpoint: which exact data produced it, and what it produced.

A checkpoint without the digest of the data that produced it cannot be reproduced, only
re-attempted; this record is that digest, plus the output bundle's identity once it is staged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.manifest import SnapshotId

RECORD_NAME = "record.json"


class OutputBundleRecord(BaseModel):
    """Where the predictions were staged, and as which immutable bundle."""

    version_id: str
    content_sha256: str
    path: str


class TrainingRecord(BaseModel):
    """The experiment record beside ``model.pt``."""

    model_config = ConfigDict(extra="forbid")

    snapshot: SnapshotId
    index_sha256: str
    index_path: str
    checkpoint_file: str
    checkpoint_sha256: str
    config: dict[str, Any]
    world_size: int
    metrics: dict[str, float]
    loss_curve: list[float]
    reconciliation: dict[str, Any]
    output_bundle: OutputBundleRecord | None = None


def write_record(directory: str | os.PathLike, record: TrainingRecord) -> Path:
    """Write (or replace) ``record.json`` in ``directory`` atomically and return its path."""
    path = Path(directory) / RECORD_NAME
    atomic_write_text(path, record.model_dump_json(indent=2) + "\n")
    return path


def read_record(path: str | os.PathLike) -> TrainingRecord:
    """Read a record written by :func:`write_record`."""
    return TrainingRecord.model_validate_json(Path(path).read_text())
