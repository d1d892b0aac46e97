"""The reference trainer's predictions: one row per item, keyed by the same id.

Failed and abstained items are predicted too, so the table accounts for the whole manifest;
their ``lithi_status`` travels beside the prediction so a reader can tell them apart, and
``holdout`` says which rows the fit held out (its holdout metrics are over the accepted ones).
Items are read with the iterable reader, in part order: its memory is one row group, where the
map-style reader keeps every decoded part it touched (the whole bundle, for a full pass). The
predictions leave as a stream of record batches, one per loader batch, which the pipeline writes
in row groups as they come (:mod:`pipeline.training.predictions`): no step holds the table.
Columns stay Arrow and numpy end to end; no per-item Python object is made. On a GPU
(``ctx.device``) the model runs there, on batches large enough to keep it busy, and only its
outputs come back.

What the features met is counted and reported in ``ctx.metadata``: values filled (missing) and
values a category's vocabulary never saw in training (unseen, predicted with the all-zero
encoding), per feature. A checkpoint trained with ``missing`` ``drop`` or ``refuse`` never saw a
missing value, so a row missing one gets a null prediction rather than a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from pipeline.bundle import format as fmt
from pipeline.training.device import to_device
from pipeline.training.features import (
    FeatureColumn,
    FeatureSpec,
    ValueCounts,
    batch_holdout,
    incomplete_rows,
    to_features,
)
from pipeline.training.fit import CHECKPOINT
from pipeline.training.model import MLP, load_checkpoint, scores
from pipeline.training.trainer import PredictContext

#: Rows per prediction batch: on the CPU enough that each batch's fixed Python work is small
#: beside its arithmetic, with temporaries of a few MiB; on a GPU enough that a launch's fixed
#: cost is small beside its work.
BATCH_ROWS = {"cpu": 8192, "cuda": 16384}


def predict_reference(
    ctx: PredictContext, *, batch_size: int | None = None
) -> pa.RecordBatchReader:
    """Predict every item of ``ctx.index`` with the checkpoint in ``ctx.checkpoint_dir``, as a
    stream of record batches (one per loader batch; nothing is held beyond one).

    Classification gives the class and its probability (``score``); regression gives the value.
    ``ctx.metadata`` is filled in once the stream has been read to its end.
    """
    model, spec = load_checkpoint(ctx.checkpoint_dir / CHECKPOINT)
    model.to(ctx.device)
    if batch_size is None:
        batch_size = BATCH_ROWS.get(ctx.device.type, BATCH_ROWS["cpu"])
    index = ctx.index
    classify = spec.task == "classification"
    schema = pa.schema(
        [
            (index.id_field, pa.string()),
            ("prediction", pa.array(spec.classes).type if classify else pa.float64()),
            *([("score", pa.float32())] if classify else []),
            *([(fmt.STATUS_COLUMN, pa.string())] if index.is_result else []),
            ("holdout", pa.bool_()),
            # One digest for every row: dictionary-encoded, so n rows cost n bytes, not n x 64
            # (a staged bundle declares it string; Parquet stores it dictionary-encoded anyway).
            ("checkpoint_sha256", pa.dictionary(pa.int8(), pa.string())),
        ]
    )
    loader = ctx.loader(
        style="iterable",
        batch_size=batch_size,
        shuffle=False,
        num_workers=0,
        columns=[c.name for c in spec.columns],  # and the id and lithi_* columns
    )
    return pa.RecordBatchReader.from_batches(
        schema, _batches(ctx, model, spec, loader, schema, batch_size)
    )


@torch.no_grad()
def _batches(
    ctx: PredictContext,
    model: MLP,
    spec: FeatureSpec,
    loader: Iterable[dict[str, Any]],
    schema: pa.Schema,
    batch_size: int,
) -> Iterator[pa.RecordBatch]:
    index, device = ctx.index, ctx.device
    classify = spec.task == "classification"
    classes = pa.array(spec.classes if classify else [])
    guess = ctx.config.missing == "fill"
    counts = ValueCounts()
    not_predicted = 0
    digest = pa.array([ctx.checkpoint_sha256], pa.string())
    no_digest_index = np.zeros(batch_size, dtype=np.int8)
    for batch in loader:
        # the split made visible: a baseline can be scored on the same held-out rows
        held = batch_holdout(batch, index, ctx.config.holdout_percent).numpy()
        batch = to_device(batch, device)
        out = scores(model, to_features(batch, spec, device=device, counts=counts))
        rows = out.shape[0]
        mask = None if guess else incomplete_rows(batch, spec, device=device).cpu().numpy()
        if mask is not None:
            not_predicted += int(mask.sum())
        ids = pa.array(batch[index.id_field], pa.string())
        columns: list[pa.Array] = [ids]
        if classify:
            score, k = torch.softmax(out, dim=1).max(dim=1)
            columns.append(classes.take(pa.array(k.cpu().numpy(), mask=mask)))
            columns.append(pa.array(score.cpu().numpy(), pa.float32(), mask=mask))
        else:
            value = out.squeeze(1).double() * spec.target_std + spec.target_mean
            columns.append(pa.array(value.cpu().numpy(), pa.float64(), mask=mask))
        if index.is_result:
            columns.append(pa.array(batch[fmt.STATUS_COLUMN], pa.string()))
        columns.append(pa.array(held, pa.bool_()))
        zeros = no_digest_index[:rows] if rows <= batch_size else np.zeros(rows, np.int8)
        columns.append(pa.DictionaryArray.from_arrays(pa.array(zeros), digest))
        yield pa.RecordBatch.from_arrays(columns, schema=schema)
    ctx.metadata.update(_report(counts, spec.columns, not_predicted))


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
