"""Predict every item of an index with a checkpoint: one row per item, keyed by the same id.

Failed and abstained items are predicted too, so the table accounts for the whole manifest;
their ``lithi_status`` travels beside the prediction so a reader can tell them apart.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import torch

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import sha256_file
from pipeline.readers.index import Index
from pipeline.readers.loader import make_loader
from pipeline.training.features import to_features
from pipeline.training.model import load_checkpoint


@torch.no_grad()
def predict(
    index: Index,
    checkpoint: str | os.PathLike,
    *,
    checkpoint_sha256: str | None = None,
    batch_size: int = 1024,
) -> pa.Table:
    """One row per index item, failed and abstained too, keyed by the same string id.

    Each row carries the checkpoint's digest: ``checkpoint_sha256`` when the caller has checked
    it already, else computed here.
    """
    model, spec = load_checkpoint(checkpoint)
    digest = checkpoint_sha256 or sha256_file(checkpoint)
    loader = make_loader(
        index, style="map", batch_size=batch_size, num_workers=0, shuffle=False, rank=0,
        world_size=1,
    )  # fmt: skip
    ids: list[str] = []
    preds: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    statuses: list[str] = []
    classes = torch.tensor(spec.classes)
    for batch in loader:
        prob = torch.softmax(model(to_features(batch, spec)), dim=1)
        score, k = prob.max(dim=1)
        ids += batch[index.id_field]
        statuses += batch[fmt.STATUS_COLUMN]
        preds.append(classes[k].numpy())
        scores.append(score.numpy().astype(np.float32))
    n = len(ids)
    return pa.table(
        {
            index.id_field: pa.array(ids, pa.string()),
            "prediction": pa.array(np.concatenate(preds) if preds else [], pa.int64()),
            "score": pa.array(np.concatenate(scores) if scores else [], pa.float32()),
            fmt.STATUS_COLUMN: pa.array(statuses, pa.string()),
            "checkpoint_sha256": pa.array([digest] * n, pa.string()),
        }
    )
