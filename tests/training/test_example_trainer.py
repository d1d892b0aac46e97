"""The README's trainer of your own (``examples/weighted_trainer.py``) on one rank, in-process:
it fits through the pipeline's loader, writes both checkpoint files, reconciles, and predicts one
row per item keyed by the id.

On two torchrun ranks, from the README's own commands, it is
``tests/integration/test_examples.py``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.readers.index import Index
from pipeline.readers.reconcile import keyed_coverage
from pipeline.training import load_trainer
from tests.helpers.bundles import stage_result
from tests.helpers.training import train

TRAINER = "examples.weighted_trainer:WeightedTrainer"
FEATURES = ["a", "b", "c"]


def test_the_example_trainer_fits_and_predicts_on_one_rank(tmp_path):
    rng = np.random.default_rng(4)
    n = 600
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 3)) + 3 * y[:, None]  # separable along every feature
    status = np.where(rng.random(n) < 0.1, "failed", "accepted")
    table = pa.table(
        {
            "id": pa.array([f"BC/{i:04d}-x" for i in range(n)]),
            **{f: pa.array(x[:, j]) for j, f in enumerate(FEATURES)},
            "label": pa.array(y.astype(np.int64)),
            "lithi_status": pa.array(status),
            "lithi_confidence": pa.array(
                [None if s == "failed" else 0.8 for s in status], pa.float32()
            ),
            "lithi_verification": pa.array(["agree"] * n),
        }
    )
    index = Index.from_snapshot(stage_result(table, tmp_path / "bundle", rows_per_part=200))
    config = {"label": "label", "features": FEATURES, "epochs": 8}
    result, report, _, files, predictions = train(
        index, tmp_path / "checkpoint", config, load_trainer(TRAINER)
    )
    assert report.ok and report.items_iterated == n
    assert result.features.used == FEATURES
    assert result.loss_curve[-1] < result.loss_curve[0]
    assert set(files.files) == {"model.pt", "scaling.json"}
    assert predictions.column_names == ["id", "probability", "prediction"]
    assert keyed_coverage(index.ids, predictions.column("id")).ok
    joined = predictions.join(table.select(["id", "label"]), "id")
    accuracy = np.mean(joined["prediction"].to_numpy() == joined["label"].to_numpy())
    assert accuracy > 0.9
