"""The reference trainer's predictions: one row per item, keyed by the same id.

Failed and abstained items are predicted too, so the table accounts for the whole manifest;
their ``lithi_status`` travels beside the prediction so a reader can tell them apart, and
``holdout`` says which rows the fit held out (its holdout metrics are over the accepted ones).
Items are read with the iterable reader, in part order: its memory is one row group, where the
map-style reader keeps every decoded part it touched (the whole bundle, for a full pass).
Columns stay Arrow and numpy end to end; no per-item Python object is made. On a GPU
(``ctx.device``) the model runs there, on batches large enough to keep it busy, and only its
outputs come back.

What the features met is counted and reported in ``ctx.metadata``: values filled (missing) and
values a category's vocabulary never saw in training (unseen, predicted with the all-zero
encoding), per feature. A checkpoint trained with ``missing`` ``drop`` or ``refuse`` never saw a
missing value, so a row missing one gets a null prediction rather than a guess.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from pipeline.bundle import format as fmt
from pipeline.training.device import to_device
from pipeline.training.features import (
    FeatureColumn,
    ValueCounts,
    holdout_flags,
    incomplete_rows,
    to_features,
)
from pipeline.training.fit import CHECKPOINT
from pipeline.training.model import load_checkpoint
from pipeline.training.trainer import PredictContext

#: Rows per prediction batch: on the CPU a batch whose temporaries stay in cache; on a GPU one
#: large enough that a launch's fixed cost is small beside its work.
BATCH_ROWS = {"cpu": 1024, "cuda": 16384}


@torch.no_grad()
def predict_reference(ctx: PredictContext, *, batch_size: int | None = None) -> pa.Table:
    """Predict every item of ``ctx.index`` with the checkpoint in ``ctx.checkpoint_dir``.

    Classification gives the class and its probability (``score``); regression gives the value.
    """
    model, spec = load_checkpoint(ctx.checkpoint_dir / CHECKPOINT)
    device = ctx.device
    model.to(device)
    if batch_size is None:
        batch_size = BATCH_ROWS.get(device.type, BATCH_ROWS["cpu"])
    index = ctx.index
    loader = ctx.loader(
        style="iterable",
        batch_size=batch_size,
        shuffle=False,
        num_workers=0,
        columns=[c.name for c in spec.columns],  # and the id and lithi_* columns
    )
    ids: list[pa.Array] = []
    statuses: list[pa.Array] = []
    # Results go into arrays allocated once: a small array kept per batch, between the batch's
    # large temporaries, fragments the C heap so it never shrinks (see pipeline.training.memory).
    cap = len(index)
    classify = spec.task == "classification"
    preds = np.empty(cap, dtype=np.int64 if classify else np.float64)
    scores = np.empty(cap if classify else 0, dtype=np.float32)
    n = 0
    counts = ValueCounts()
    guess = ctx.config.missing == "fill"
    unknown = np.zeros(0 if guess else cap, dtype=np.bool_)  # rows predicted as null
    for batch in loader:
        batch = to_device(batch, device)
        out = model(to_features(batch, spec, device=device, counts=counts))
        if not guess:
            gap = incomplete_rows(batch, spec, device=device)
            unknown[n : n + out.shape[0]] = gap.cpu().numpy()
        ids.append(pa.array(batch[index.id_field], pa.string()))
        if index.is_result:
            statuses.append(pa.array(batch[fmt.STATUS_COLUMN], pa.string()))
        rows = out.shape[0]
        if classify:
            score, k = torch.softmax(out, dim=1).max(dim=1)
            preds[n : n + rows] = k.cpu().numpy()
            scores[n : n + rows] = score.cpu().numpy()
        else:
            value = out.squeeze(1).double() * spec.target_std + spec.target_mean
            preds[n : n + rows] = value.cpu().numpy()
        n += rows
    columns: dict[str, pa.Array] = {
        index.id_field: pa.concat_arrays(ids) if ids else pa.array([], pa.string())
    }
    mask = None if guess else unknown[:n]
    if classify:
        columns["prediction"] = pa.array(spec.classes).take(pa.array(preds[:n], mask=mask))
        columns["score"] = pa.array(scores[:n], pa.float32(), mask=mask)
    else:
        columns["prediction"] = pa.array(preds[:n], pa.float64(), mask=mask)
    if index.is_result:
        columns[fmt.STATUS_COLUMN] = pa.concat_arrays(statuses)
    # the split made visible: a baseline can be scored on the same held-out rows
    columns["holdout"] = pa.array(
        holdout_flags(columns[index.id_field], ctx.config.holdout_percent), pa.bool_()
    )
    # One digest for every row: dictionary-encoded, so n rows cost n bytes, not n x 64 (a
    # staged bundle declares it string; Parquet stores it dictionary-encoded either way).
    columns["checkpoint_sha256"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, dtype=np.int8)), pa.array([ctx.checkpoint_sha256], pa.string())
    )
    ctx.metadata.update(_report(counts, spec.columns, 0 if guess else int(unknown[:n].sum())))
    return pa.table(columns)


def _report(
    counts: ValueCounts, columns: list[FeatureColumn], not_predicted: int
) -> dict[str, int]:
    """Totals always; per feature (``filled/<name>``, ``unseen/<name>``) only where nonzero, so
    a wide table of complete columns adds two entries, not two per column."""
    filled = {name: int(n) for name, n in counts.filled.items()}
    unseen = {name: int(n) for name, n in counts.unseen.items()}
    out = {"values_filled": sum(filled.values()), "values_unseen": sum(unseen.values())}
    for col in columns:
        for kind, found in (("filled", filled), ("unseen", unseen)):
            if found.get(col.name):
                out[f"{kind}/{col.name}"] = found[col.name]
    if not_predicted:
        out["rows_not_predicted"] = not_predicted
    return out
