"""The training core on its own: features from the manifest, hold-out by id, fit, predict."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.bundle.digest import sha256_file
from pipeline.bundle.manifest import InputRef, JobInfo
from pipeline.bundle.stage import stage
from pipeline.readers.index import Index
from pipeline.training.features import feature_columns, holdout_mask
from pipeline.training.fit import TrainConfig, fit
from pipeline.training.model import load_checkpoint, save_checkpoint
from pipeline.training.predict import predict


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    """1,009 items in three separable classes, ~10% failed and ~10% abstained."""
    rng = np.random.default_rng(0)
    n = 1009
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 8)) + 3 * y[:, None]).astype(np.float32)
    u = rng.random(n)
    status = np.where(u < 0.1, "failed", np.where(u < 0.2, "abstained", "accepted"))
    table = pa.table(
        {
            "id": [f"{i:05d}" for i in range(n)],
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8),
            "scalar": pa.array(rng.normal(size=n), pa.float64()),
            "note": ["n"] * n,
            "label": pa.array(y, pa.int64()),  # ground truth: never a feature
            "lithi_status": status,
            "lithi_confidence": pa.array(
                [None if s == "failed" else 0.9 for s in status], pa.float32()
            ),
            "lithi_verification": ["agree"] * n,
            "lithi_label": pa.array(
                [int(v) if s == "accepted" else None for v, s in zip(y, status, strict=True)],
                pa.int64(),
            ),
        }
    )
    snap = stage(
        table,
        tmp_path_factory.mktemp("b") / "bundle",
        id_field="id",
        kind="result",
        rows_per_part=150,
        job=JobInfo(job_id="j", status="SUCCEEDED", attempt=1),
        input=InputRef(version_id="in", content_sha256="0" * 64),
    )
    return Index.from_snapshot(snap)


def test_features_are_the_numeric_columns_the_manifest_declares(index):
    cols = feature_columns(index.schema, index.id_field, "lithi_label")
    assert cols == ["x", "scalar"]  # not the id, the string, the truth, nor any lithi_ column


def test_holdout_is_a_function_of_the_id_alone():
    ids = [f"item-{i}" for i in range(2000)]
    mask = holdout_mask(ids, 20)
    assert 300 < int(mask.sum()) < 500
    again = holdout_mask(list(reversed(ids)), 20)
    assert torch.equal(mask, again.flip(0))  # order, seed and process never move an item
    assert not holdout_mask(ids, 0).any()


def test_holdout_is_the_same_in_every_process():
    """Python's str hash is salted per process; a split built on it would differ by rank."""
    code = (
        "from pipeline.training.features import holdout_mask;"
        "print(''.join('1' if b else '0' for b in holdout_mask([f'i{n}' for n in range(300)], 20)))"
    )
    masks = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(masks) == 1 and "1" in masks.pop()


def test_fit_learns_reconciles_and_predicts_every_item(index, tmp_path):
    config = TrainConfig(epochs=4, num_workers=0)
    outcome = fit(index, config, log=lambda _: None)
    assert outcome.metrics["holdout_accuracy"] > 0.9
    assert outcome.report.ok and outcome.report.items_iterated == len(index)
    assert outcome.report.by_status_found == index.manifest.counts.by_status
    assert len(outcome.loss_curve) == 4 and outcome.loss_curve[-1] < outcome.loss_curve[0]

    path = tmp_path / "model.pt"

    def save() -> str:
        return save_checkpoint(
            path,
            state_dict=outcome.state_dict,
            spec=outcome.spec,
            config=config.model_dump(),
            hidden=config.hidden,
        )

    digest = save()
    assert digest == sha256_file(path)
    with pytest.raises(FileExistsError):
        save()  # a checkpoint is never overwritten
    model, spec = load_checkpoint(path)
    assert spec.columns == ["x", "scalar"] and spec.classes == [0, 1, 2]

    table = predict(index, path)
    assert table.num_rows == len(index)
    assert table.column("id").combine_chunks().equals(index.ids)  # same string ids, same order
    assert set(table.column("checkpoint_sha256").to_pylist()) == {digest}
    statuses = set(table.column("lithi_status").to_pylist())
    assert statuses == {"accepted", "failed", "abstained"}  # failed and abstained predicted too


def test_unknown_feature_column_names_the_declared_ones(index):
    with pytest.raises(KeyError, match="declared"):
        fit(index, TrainConfig(epochs=1, num_workers=0, feature_columns=["nope"]))
