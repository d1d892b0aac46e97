"""The reference trainer on data sets the project never used, through the whole chain.

scikit-learn's breast-cancer set (569 rows, 30 float features, a 0/1 diagnosis) is a
classification; its diabetes set (442 rows, 10 features, a continuous disease progression) is a
regression. Each is staged as a user would (``examples/stage_own_table.py``), read through
``LITHI_BUNDLE_URL`` and trained with explicit features. The metrics are printed for the record.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples.stage_own_table import main as stage_own_table
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.training.record import OutputRecord, read_record
from resources.settings import LithiEnv


def _stage(tmp_path: Path, data, target_name: str) -> tuple[Path, list[str]]:
    names = [str(n) for n in data.feature_names]
    columns = {"id": pa.array([f"row-{i}" for i in range(len(data.target))])}
    columns |= {n: pa.array(data.data[:, j]) for j, n in enumerate(names)}
    columns[target_name] = pa.array(data.target)
    pq.write_table(pa.table(columns), tmp_path / "table.parquet")
    out = tmp_path / "bundles" / "v1"
    assert (
        stage_own_table([str(tmp_path / "table.parquet"), "--id-field", "id", "--out", str(out)])
        == 0
    )
    return out, names


def _train(tmp_path: Path, url: Path, config: str) -> OutputRecord:
    env = LithiEnv(
        home=tmp_path / "home", bundle_url=str(url), trainer_config=config, num_workers=0
    )
    with dg.instance_for_test() as instance:
        result = (
            build_definitions(env)
            .resolve_job_def(CHAIN_JOB_NAME)
            .execute_in_process(instance=instance)
        )
    assert result.success
    assert all(c.passed for c in result.get_asset_check_evaluations())
    meta = result.asset_materializations_for_node("output_bundle")[0].metadata
    return read_record(meta["record"].value, OutputRecord)


def test_breast_cancer_classification(tmp_path):
    from sklearn.datasets import load_breast_cancer

    url, features = _stage(tmp_path, load_breast_cancer(), "diagnosis")
    config = f'{{"label": "diagnosis", "features": {features!r}, "epochs": 15}}'.replace("'", '"')
    record = _train(tmp_path, url, config)
    m = record.training.metrics
    print(f"\nbreast cancer: held-out accuracy {m['holdout_accuracy']:.3f} over "
          f"{int(m['holdout_items'])} rows, train accuracy {m['train_accuracy']:.3f}")  # fmt: skip
    assert m["holdout_accuracy"] > 0.9
    assert record.training.features.used == features  # explicit: 'diagnosis' never a feature


def test_diabetes_regression(tmp_path):
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    url, features = _stage(tmp_path, data, "progression")
    config = (
        f'{{"task": "regression", "label": "progression", "features": {features!r}, '
        '"epochs": 30, "hidden": 16, "learning_rate": 0.003}'
    ).replace("'", '"')
    record = _train(tmp_path, url, config)
    m = record.training.metrics
    spread = float(np.std(data.target))
    print(f"\ndiabetes: held-out RMSE {m['holdout_rmse']:.1f}, MAE {m['holdout_mae']:.1f} over "
          f"{int(m['holdout_items'])} rows (target std {spread:.1f}); train RMSE "
          f"{m['train_rmse']:.1f}")  # fmt: skip
    assert "holdout_accuracy" not in m
    assert m["holdout_rmse"] < 0.85 * spread  # clearly better than predicting the mean
    assert m["holdout_mae"] < m["holdout_rmse"]


@pytest.mark.parametrize("label", ["diagnosis"])
def test_a_float_label_cannot_be_a_class(tmp_path, label):
    from sklearn.datasets import load_breast_cancer

    url, _ = _stage(tmp_path, load_breast_cancer(), label)
    env = LithiEnv(
        home=tmp_path / "home",
        bundle_url=str(url),
        trainer_config='{"label": "mean radius", "features": ["mean texture"]}',
        num_workers=0,
    )
    with dg.instance_for_test() as instance:
        result = (
            build_definitions(env)
            .resolve_job_def(CHAIN_JOB_NAME)
            .execute_in_process(instance=instance, raise_on_error=False)
        )
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert "'mean radius' is float64" in str(error) and "regression" in str(error)
