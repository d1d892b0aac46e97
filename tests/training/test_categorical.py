"""Your own table as a user finds it: string and dictionary features, stated nulls, early errors.

One result bundle holds what a tabular user brings (Palmer Penguins has all of it): a small
string column with nulls, a dictionary-encoded one with many values, a float with nulls and
NaNs, a nullable int. The reference trainer takes every one of them, says how many values it
filled, keeps the vocabulary it learned in the checkpoint, and counts the values it never saw.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from pipeline.readers.index import Index
from pipeline.training import TrainerError, load_trainer
from pipeline.training.features import FeatureColumn, FeatureSpec, holdout_mask
from pipeline.training.model import MLP, load_checkpoint, save_checkpoint
from pipeline.training.reference import ReferenceTrainer
from pipeline.training.reference_config import ReferenceConfig, check_config, checkpoint_config
from pipeline.training.runner import summarize
from tests.helpers.bundles import stage_result
from tests.helpers.refusals import one_line_refusal
from tests.helpers.tabular import FEATURES, penguins
from tests.helpers.training import predict_context, train


def _index(root: Path, table: pa.Table) -> Index:
    return Index.from_snapshot(stage_result(table, root, rows_per_part=150))


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return penguins()


@pytest.fixture(scope="module")
def index(table, tmp_path_factory) -> Index:
    return _index(tmp_path_factory.mktemp("penguins") / "bundle", table)


def _missing_among_accepted(table: pa.Table) -> dict[str, int]:
    """What the fit must say it filled: nulls (and NaNs) among the rows it fits on."""
    rows = table.filter(pc.equal(table["lithi_status"], "accepted"))
    out = {}
    for name in FEATURES:
        out[name] = pc.sum(rows[name].is_null(nan_is_null=True)).as_py()
    return out


def _training_split_values(table: pa.Table, column: str) -> list[str]:
    """The values of ``column`` on the rows the vocabulary is learned from: accepted, not held
    out (20%), nulls aside."""
    held = holdout_mask(table["id"].to_pylist(), 20).numpy()
    accepted = np.array(table["lithi_status"].to_pylist()) == "accepted"
    values = table[column].cast(pa.string()).to_pylist()
    return sorted({v for v, a, h in zip(values, accepted, held, strict=True) if a and not h and v})


def _ckpt_columns(out: Path) -> dict[str, dict]:
    ckpt = torch.load(out / "model.pt", weights_only=True)
    return {c["name"]: c for c in ckpt["spec"]["columns"]}


@pytest.mark.parametrize(("task", "label"), [("classification", "kind"), ("regression", "mass")])
def test_string_dictionary_and_nullable_features_train_with_a_saved_vocabulary(
    index, table, tmp_path, task, label
):
    config = {"task": task, "label": label, "features": FEATURES, "epochs": 25}
    result, report, _, files, predictions = train(index, tmp_path / "ckpt", config)
    assert report.ok and predictions.num_rows == len(index)

    columns = _ckpt_columns(tmp_path / "ckpt")
    assert columns["island"]["encoding"] == "one_hot"
    assert columns["island"]["vocabulary"] == _training_split_values(table, "island")
    assert columns["site"]["encoding"] == "embedding"
    assert columns["site"]["vocabulary"] == _training_split_values(table, "site")
    assert "encoding" not in columns["bill"], "a numeric column is stored as it always was"

    assert result.features.filled == _missing_among_accepted(table)
    assert result.features.filled["site"] == 0 and result.features.filled["bill"] > 0
    summary = json.loads(summarize(run_result(result, report), files, 1).model_dump_json())
    assert summary["features"]["filled"] == _missing_among_accepted(table)
    assert all(isinstance(v, float) for v in summary["metrics"].values()), summary["metrics"]
    # the split is in the predictions: the rows the holdout metrics were measured on
    held = holdout_mask(predictions["id"].to_pylist(), 20).tolist()
    assert predictions["holdout"].to_pylist() == held

    m = result.metrics
    if task == "classification":
        assert m["holdout_accuracy"] > 0.85, m
        assert set(predictions["prediction"].to_pylist()) <= {"adelie", "gentoo", "chinstrap"}
    else:
        spread = float(np.nanstd(table["mass"].to_numpy(zero_copy_only=False)))
        assert m["holdout_rmse"] < 0.5 * spread, (m, spread)


def run_result(result, report):
    """A :class:`FitRun` as the pipeline hands it to ``summarize``."""
    from pipeline.training.runner import FitRun

    return FitRun(result, report, passes=0)


def test_a_metric_of_exactly_one_stays_a_float_in_the_summary(index, tmp_path):
    _, report, _, files, _ = train(index, tmp_path / "c", {"label": "kind", "features": ["bill"]})
    from pipeline.training.trainer import FitResult

    run = run_result(FitResult(metrics={"holdout_accuracy": 1, "holdout_items": 3}), report)
    text = summarize(run, files, 1).model_dump_json()
    assert '"holdout_accuracy":1.0' in text and '"holdout_items":3.0' in text


def test_the_vocabulary_limit_decides_one_hot_or_embedding(index, tmp_path):
    config = {"label": "kind", "features": ["island", "site"], "epochs": 1}
    train(index, tmp_path / "a", {**config, "one_hot_max": 2})
    train(index, tmp_path / "b", {**config, "one_hot_max": 40})
    small, large = _ckpt_columns(tmp_path / "a"), _ckpt_columns(tmp_path / "b")
    assert small["island"]["encoding"] == "embedding" and small["site"]["encoding"] == "embedding"
    assert large["island"]["encoding"] == "one_hot" and large["site"]["encoding"] == "one_hot"
    model, spec = load_checkpoint(tmp_path / "a" / "model.pt")
    assert [e.num_embeddings for e in model.embeddings] == [4, 41]  # the unknown slot, then each


def test_the_vocabulary_keeps_the_most_frequent_values_ties_by_value(tmp_path):
    table = penguins(n=300)
    config = {"label": "kind", "features": ["site"], "epochs": 1, "max_categories": 5}
    train(_index(tmp_path / "bundle", table), tmp_path / "c", config)
    held = holdout_mask(table["id"].to_pylist(), 20).numpy()
    accepted = np.array(table["lithi_status"].to_pylist()) == "accepted"
    counts = Counter(
        v
        for v, a, h in zip(table["site"].cast(pa.string()).to_pylist(), accepted, held, strict=True)
        if a and not h
    )
    top = sorted(counts, key=lambda v: (-counts[v], v))[:5]
    assert _ckpt_columns(tmp_path / "c")["site"]["vocabulary"] == sorted(top)


def test_unseen_values_at_prediction_are_predicted_and_counted(index, tmp_path):
    config = {"label": "kind", "features": FEATURES, "epochs": 2}
    trainer = load_trainer("pipeline.training.reference:ReferenceTrainer")
    train(index, tmp_path / "ckpt", config, trainer)
    new = penguins(seed=7, n=200, islands=["Biscoe", "Atlantis"])
    other = _index(tmp_path / "new", new)
    ctx = predict_context(trainer, other, config, tmp_path / "ckpt")
    predictions = trainer.predict(ctx).read_all()
    assert predictions.num_rows == len(other) and predictions["prediction"].null_count == 0
    atlantis = new["island"].to_pylist().count("Atlantis")
    assert atlantis > 0
    assert ctx.metadata["unseen/island"] == atlantis
    assert "unseen/site" not in ctx.metadata  # every site was seen in training
    assert ctx.metadata["values_unseen"] == atlantis
    assert ctx.metadata["filled/island"] == new["island"].null_count


def test_missing_values_can_drop_the_row(index, table, tmp_path):
    config = {"label": "kind", "features": FEATURES, "epochs": 2, "missing": "drop"}
    result, report, _, _, predictions = train(index, tmp_path / "c", config)
    assert report.ok
    accepted = table.filter(pc.equal(table["lithi_status"], "accepted"))
    incomplete = _incomplete(accepted)
    assert result.features.rows_dropped == int(incomplete.sum()) > 0
    assert result.features.filled == {}
    # every item still has a row; the ones missing a feature are not guessed
    assert predictions.num_rows == len(index)
    assert predictions["prediction"].null_count == int(_incomplete(table).sum())
    assert predictions["score"].null_count == predictions["prediction"].null_count


def _incomplete(t: pa.Table) -> np.ndarray:
    rows = np.zeros(t.num_rows, dtype=bool)
    for name in FEATURES:
        rows |= np.asarray(t[name].is_null(nan_is_null=True).to_pylist(), dtype=bool)
    return rows


def test_missing_values_can_refuse_the_fit_in_one_line_naming_each_column(index, tmp_path):
    config = {"label": "kind", "features": FEATURES, "epochs": 1, "missing": "refuse"}
    message = one_line_refusal(TrainerError, train, index, tmp_path / "c", config)
    filled = _missing_among_accepted(penguins())
    assert message.startswith(f"feature 'island' has {filled['island']} missing value(s)")
    assert f"'bill' has {filled['bill']}" in message
    assert "'site'" not in message and "missing" in message and "'fill'" in message
    assert not (tmp_path / "c" / "model.pt").exists()
    # a column without a missing value trains under 'refuse'
    train(index, tmp_path / "d", {**config, "features": ["site"]})


# -- errors before work ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("features", "start", "hint"),
    [
        (["flipper"], "feature 'flipper' is not a column", "'bill'"),
        (["tags"], "feature 'tags' is list<string>:", "would work"),
        (["bill", "lithi_confidence"], "feature 'lithi_confidence' is a lithi_* result", ""),
    ],
)
def test_a_wrong_feature_is_refused_against_the_schema_in_one_line(index, features, start, hint):
    config = ReferenceConfig(label="kind", features=features)
    message = one_line_refusal(TrainerError, check_config, config, index.schema, "id")
    assert message.startswith(start) and hint in message


def test_a_nested_struct_is_refused_in_an_arrow_schema_in_one_line():
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("kind", pa.string()),
            ("pos", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
        ]
    )
    config = ReferenceConfig(label="kind", features=["pos"])
    message = one_line_refusal(TrainerError, check_config, config, schema, "id")
    assert message.startswith("feature 'pos' is struct<x: double, y: double>:")
    assert "'pos.x'" in message and "would work" in message


def test_the_trainer_checks_its_config_before_any_work(index):
    trainer = ReferenceTrainer()
    config = trainer.parse_config({"label": "kind", "features": ["tags"]})
    refusal = one_line_refusal(TrainerError, trainer.check, config, index.schema, "id")
    assert refusal.startswith("feature 'tags' is list<string>")
    trainer.check(trainer.parse_config({"label": "kind", "features": FEATURES}), index.schema, "id")


def test_auto_features_says_how_to_use_a_string_column(index, tmp_path):
    config = {"label": "kind", "auto_features": True, "exclude": ["mass"], "epochs": 1}
    result, *_ = train(index, tmp_path / "c", config)
    assert result.features.used == ["bill", "year"]  # numeric only, as auto always chose
    assert "name it in 'features'" in result.features.dropped["island"]
    assert "name it in 'features'" in result.features.dropped["site"]


# -- what existing checkpoints hold, byte for byte ------------------------------------------
#: A numeric spec and a config as every checkpoint before categorical features stored them.
OLD_SPEC = (
    '{"task": "classification", "label": "y", "columns": [{"name": "x", "width": 2, "nullable": '
    'true}, {"name": "n", "width": 1, "nullable": false}], "mean": [0.5, 1.0, 2.0], "std": [1.0, '
    '2.0, 3.0], "classes": ["a", "b"], "target_mean": 0.0, "target_std": 1.0}'
)
OLD_CONFIG = (
    '{"task": "classification", "label": "lithi_label", "features": ["x"], "auto_features": '
    'false, "exclude": [], "epochs": 12, "batch_size": 64, "learning_rate": 0.003, "hidden": '
    '128, "seed": 0, "reader": "map", "accepted_only": true, "weight_by_confidence": true, '
    '"holdout_percent": 20}'
)


def test_a_numeric_checkpoint_holds_the_same_plain_data_and_bytes_as_before(tmp_path):
    spec = FeatureSpec(
        task="classification",
        label="y",
        columns=[
            FeatureColumn(name="x", width=2, nullable=True),
            FeatureColumn(name="n", width=1, nullable=False),
        ],
        mean=[0.5, 1.0, 2.0],
        std=[1.0, 2.0, 3.0],
        classes=["a", "b"],
    )
    assert json.dumps(spec.model_dump(mode="json")) == OLD_SPEC
    config = checkpoint_config(ReferenceConfig(features=["x"]))
    assert json.dumps(config) == OLD_CONFIG
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in MLP(spec.dim, 8, spec.outputs).state_dict().items()}
    save_checkpoint(tmp_path / "new.pt", state_dict=state, spec=spec, config=config, hidden=8)
    old = {"state_dict": state, **json.loads(f'{{"spec": {OLD_SPEC}, "config": {OLD_CONFIG}}}')}
    buf = io.BytesIO()  # a path would name the archive inside after the file
    torch.save({**old, "hidden": 8}, buf)
    (tmp_path / "old.pt").write_bytes(buf.getvalue())
    assert (tmp_path / "new.pt").read_bytes() == (tmp_path / "old.pt").read_bytes()
    model, loaded = load_checkpoint(tmp_path / "old.pt")
    assert loaded == spec and model.embeddings is None
