"""Predictions stream to one Parquet file in row groups: never held whole, whole or absent."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bundle.writer import ROW_GROUP_ROWS
from pipeline.readers.index import Index
from pipeline.training import TrainerError, load_trainer, predict
from pipeline.training.predictions import PredictionFile, write_predictions
from tests.helpers.bundles import stage_result
from tests.helpers.training import predict_context, train

TRAINER = "tests.example:Mine"
N = 3000


def _batches(n: int, size: int):
    for start in range(0, n, size):
        stop = min(n, start + size)
        yield pa.record_batch(
            {
                "id": pa.array([f"{i:05d}" for i in range(start, stop)]),
                "lithi_status": pa.array(["failed" if i % 10 == 0 else "accepted"
                                          for i in range(start, stop)]),
                "prediction": pa.array(np.arange(start, stop, dtype=np.float64)),
            }
        )  # fmt: skip


SCHEMA = next(_batches(1, 1)).schema


def test_a_stream_is_written_in_row_groups_and_counted_on_the_way(tmp_path):
    n = 2 * ROW_GROUP_ROWS + 5
    reader = pa.RecordBatchReader.from_batches(SCHEMA, _batches(n, 1000))
    out = write_predictions(reader, tmp_path / "p.parquet", id_field="id", trainer=TRAINER)
    meta = pq.ParquetFile(out.path).metadata
    assert out.rows == n == meta.num_rows
    # row groups of at least ROW_GROUP_ROWS rows (the last one aside), not one per small batch
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert len(groups) == 2 and groups[0] >= ROW_GROUP_ROWS
    assert out.by_status == {"accepted": n - (n + 9) // 10, "failed": (n + 9) // 10, "abstained": 0}
    assert out.column("id").to_pylist()[:3] == ["00000", "00001", "00002"]
    streamed = list(out.iter_batches(batch_size=4096))
    assert max(b.num_rows for b in streamed) == 4096
    assert sum(b.num_rows for b in streamed) == n
    assert out.read().equals(pa.Table.from_batches(_batches(n, 1000)))


def test_a_table_is_accepted_as_before(tmp_path):
    table = pa.Table.from_batches(_batches(N, 500))
    out = write_predictions(table, tmp_path / "p.parquet", id_field="id", trainer=TRAINER)
    assert out.rows == N and out.read().equals(table)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ([1, 2], "tests.example:Mine.predict returned list, expected a pa.Table or a "
                 "pa.RecordBatchReader"),
        (pa.table({"key": ["a"]}), "no id column 'id'"),
    ],
)  # fmt: skip
def test_what_is_not_a_prediction_table_is_refused_and_nothing_is_written(
    tmp_path, result, message
):
    with pytest.raises(TrainerError, match=message):
        write_predictions(result, tmp_path / "p.parquet", id_field="id", trainer=TRAINER)
    assert list(tmp_path.iterdir()) == []


def test_a_stream_that_fails_midway_leaves_no_file(tmp_path):
    def broken():
        yield from _batches(ROW_GROUP_ROWS + 10, 1000)  # a row group already written
        raise RuntimeError("the model ran out of memory")

    reader = pa.RecordBatchReader.from_batches(SCHEMA, broken())
    with pytest.raises(RuntimeError, match="out of memory"):
        write_predictions(reader, tmp_path / "p.parquet", id_field="id", trainer=TRAINER)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Index:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, N)
    status = np.where(rng.random(N) < 0.1, "failed", "accepted")
    table = pa.table(
        {
            "id": pa.array([f"{i:05d}" for i in range(N)]),
            "x": pa.array((rng.normal(size=N) + 3 * y).astype(np.float32)),
            "lithi_status": pa.array(status),
            "lithi_confidence": pa.array([0.9] * N, pa.float32()),
            "lithi_verification": pa.array(["agree"] * N),
            "lithi_label": pa.array([str(v) if s == "accepted" else None
                                     for v, s in zip(y, status, strict=True)]),
        }
    )  # fmt: skip
    root = tmp_path_factory.mktemp("pred") / "bundle"
    return Index.from_snapshot(stage_result(table, root, rows_per_part=700))


def test_the_reference_trainer_streams_one_loader_batch_at_a_time(index, tmp_path, monkeypatch):
    monkeypatch.setitem(predict.BATCH_ROWS, "cpu", 256)
    config = {"label": "lithi_label", "features": ["x"], "epochs": 1, "holdout_percent": 20}
    _, _, _, files, whole = train(index, tmp_path / "ckpt", config)
    trainer = load_trainer("pipeline.training.reference:ReferenceTrainer")
    ctx = predict_context(trainer, index, config, tmp_path / "ckpt")
    assert ctx.checkpoint_sha256 == files.sha256
    reader = trainer.predict(ctx)
    assert isinstance(reader, pa.RecordBatchReader)
    sizes = []
    for batch in reader:
        sizes.append(batch.num_rows)
    assert len(sizes) > 1 and max(sizes) <= 256  # never more than one prediction batch held
    assert sum(sizes) == N
    assert ctx.metadata["values_filled"] == 0  # filled in once the stream ended
    again = trainer.predict(ctx)
    out = write_predictions(again, tmp_path / "p.parquet", id_field="id", trainer="reference")
    assert isinstance(out, PredictionFile) and out.rows == N
    assert out.read().equals(whole)
    assert out.by_status["failed"] == whole.column("lithi_status").to_pylist().count("failed")
