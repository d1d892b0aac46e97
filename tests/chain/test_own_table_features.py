"""A user's own table through the whole chain: categorical features and nulls stated in the
record and the metadata, float metrics, and a feature no model can take refused before any
training work, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from examples.stage_own_table import main as stage_own_table
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.training.record import CHECKPOINT_DIR, OutputRecord, read_record
from resources.settings import LithiEnv
from tests.helpers.tabular import FEATURES, penguins


def _bundle(tmp_path: Path) -> tuple[Path, pa.Table]:
    table = penguins(n=300)
    own = table.select([c for c in table.column_names if not c.startswith("lithi_")])
    pq.write_table(own, tmp_path / "penguins.parquet")
    out = tmp_path / "bundles" / "v1"
    argv = [str(tmp_path / "penguins.parquet"), "--id-field", "id", "--out", str(out)]
    assert stage_own_table(argv) == 0
    return out, own


def _run(tmp_path: Path, url: Path, config: dict) -> dg.ExecuteInProcessResult:
    env = LithiEnv(
        home=tmp_path / "home",
        bundle_url=str(url),
        trainer_config=json.dumps(config),
        num_workers=0,
    )
    with dg.instance_for_test() as instance:
        return (
            build_definitions(env)
            .resolve_job_def(CHAIN_JOB_NAME)
            .execute_in_process(instance=instance, raise_on_error=False)
        )


def test_categorical_features_and_filled_counts_reach_the_record_and_the_metadata(tmp_path):
    url, own = _bundle(tmp_path)
    result = _run(tmp_path, url, {"label": "kind", "features": FEATURES, "epochs": 3})
    assert result.success
    training = result.asset_materializations_for_node("training_run")[0].metadata
    output = result.asset_materializations_for_node("output_bundle")[0].metadata
    record = read_record(output["record"].value, OutputRecord).training

    nulls = {n: own[n].is_null(nan_is_null=True).to_pylist().count(True) for n in FEATURES}
    assert record.features.filled == nulls  # every row is accepted: every null was filled
    assert training["values_filled"].value == sum(nulls.values()) > 0
    assert "| filled |" in training["features"].value

    # metrics: floats in the record and the metadata, whatever their value
    assert all(isinstance(v, float) for v in record.metrics.values())
    for name in record.metrics:
        assert isinstance(training[name], dg.FloatMetadataValue), (name, training[name])

    checkpoint = Path(training["checkpoint"].value) / "model.pt"
    columns = {c["name"]: c for c in torch.load(checkpoint, weights_only=True)["spec"]["columns"]}
    assert columns["island"]["vocabulary"] == ["Biscoe", "Dream", "Torgersen"]
    assert columns["site"]["encoding"] == "embedding"

    predictions = result.asset_materializations_for_node("prediction_table")[0].metadata
    assert predictions["values_unseen"].value == 0  # the same bundle: every value was seen
    assert predictions["values_filled"].value == sum(nulls.values())


def test_a_feature_no_model_takes_is_refused_in_one_line_before_any_training_work(tmp_path):
    url, _ = _bundle(tmp_path)
    result = _run(tmp_path, url, {"label": "kind", "features": ["bill", "tags"]})
    assert not result.success
    (failure,) = result.get_step_failure_events()
    assert failure.step_key == "training_run"
    told = failure.step_failure_data.user_failure_data
    assert told is not None, "a Failure the user reads, not a crash"
    message = told.description or ""
    assert message.startswith("feature 'tags' is list<string>:") and "would work" in message
    assert "\n" not in message, message
    # nothing was trained: no checkpoint folder was ever made for the run
    assert not list((tmp_path / "home").rglob(CHECKPOINT_DIR))
