"""Fitting in tests: a small labelled result bundle to fit on (shared by the progress tests and
the SIGKILL ones), and a fit followed by its prediction as the pipeline runs them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.readers.index import Index
from pipeline.training import (
    REFERENCE_TRAINER,
    PredictContext,
    Trainer,
    hash_checkpoint,
    load_trainer,
    run_fit,
)
from tests.helpers.bundles import stage_result

N = 400  # 13 batches of 32 per epoch: the fitting pass, then EPOCHS epochs of 13 steps
BATCH = 32
EPOCHS = 3


def classes_index(root: Path) -> Index:
    """N items, 8 float features, 3 classes, 15% abstained, staged under ``root`` in 3 parts."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, N)
    x = (rng.normal(size=(N, 8)) + 2 * y[:, None]).astype(np.float32)
    status = np.where(rng.random(N) < 0.15, "abstained", "accepted")
    table = pa.table(
        {
            "id": pa.array([f"item-{i:04d}" for i in range(N)]),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8),
            "lithi_status": pa.array(status),
            "lithi_label": pa.array(
                [str(v) if s == "accepted" else None for v, s in zip(y, status, strict=True)]
            ),
            "lithi_confidence": pa.array([0.5 + 0.5 * rng.random() for _ in range(N)], "float32"),
            "lithi_verification": pa.array(["agree"] * N),
        }
    )
    return Index.from_snapshot(stage_result(table, root / "bundle", 150))


def fit_config(style: str) -> dict:
    """The reference trainer's config for a fit over :func:`classes_index` with ``style``."""
    return {"features": ["x"], "epochs": EPOCHS, "batch_size": BATCH, "reader": style, "seed": 5}


def predict_context(
    trainer: Trainer, index: Index, config: dict, checkpoint: Path
) -> PredictContext:
    """What the pipeline hands ``trainer.predict`` for ``index`` and the fit saved in
    ``checkpoint`` (in-process, no workers)."""
    return PredictContext(
        index=index,
        config=trainer.parse_config(config),
        num_workers=0,
        log=lambda _: None,
        checkpoint_dir=checkpoint,
        checkpoint_sha256=hash_checkpoint(checkpoint).sha256,
    )


def train(index: Index, out: Path, config: dict, trainer: Trainer | None = None):
    """What the pipeline does around a trainer, in-process: fit, reconcile, hash, predict."""
    trainer = trainer or load_trainer(REFERENCE_TRAINER)
    out.mkdir(parents=True, exist_ok=True)
    run = run_fit(trainer, index, config, output_dir=out, log=lambda _: None)
    result, report, passes = run.result, run.reconciliation, run.passes
    files = hash_checkpoint(out)
    table = trainer.predict(predict_context(trainer, index, config, out))
    if isinstance(table, pa.RecordBatchReader):  # streamed: read whole, the tests are small
        table = table.read_all()
    return result, report, passes, files, table
