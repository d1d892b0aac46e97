"""Predictions stream to one Parquet file in row groups: never held whole, whole or absent."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bundle.writer import ROW_GROUP_ROWS
from pipeline.readers.index import Index
from pipeline.training import TrainerError, load_trainer, predict
from pipeline.training.predictions import PredictionFile, write_predictions
from tests.helpers.bundles import stage_result
from tests.helpers.timing import limit
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


def test_the_next_rows_are_computed_while_a_row_group_is_written(tmp_path, monkeypatch):
    """The stream is asked for its next batch while a row group is still being written: the
    first write waits until the stream has passed its rows, which it never could if the
    writing held the stream up."""
    next_asked = threading.Event()
    overlapped: list[bool] = []
    write = pq.ParquetWriter.write_table

    def slow_write(self, table, *args, **kwargs):
        if not overlapped:  # the first row group: wait for the stream to go on
            overlapped.append(next_asked.wait(timeout=limit(30)))
        return write(self, table, *args, **kwargs)

    def stream():
        for i, batch in enumerate(_batches(3 * ROW_GROUP_ROWS, 1000)):
            if i * 1000 > ROW_GROUP_ROWS + 1000:  # well past the first row group
                next_asked.set()
            yield batch

    monkeypatch.setattr(pq.ParquetWriter, "write_table", slow_write)
    reader = pa.RecordBatchReader.from_batches(SCHEMA, stream())
    out = write_predictions(reader, tmp_path / "p.parquet", id_field="id", trainer=TRAINER)
    assert overlapped == [True]
    assert out.read().equals(pa.Table.from_batches(_batches(3 * ROW_GROUP_ROWS, 1000)))


@pytest.mark.parametrize("failing", [2, 4], ids=["midway", "the-last"])
def test_a_write_that_fails_is_raised_and_leaves_no_file(tmp_path, monkeypatch, failing):
    """A row group the writer thread fails to write fails the whole file, the last one too."""
    written: list[int] = []
    write = pq.ParquetWriter.write_table

    def failing_write(self, table, *args, **kwargs):
        written.append(table.num_rows)
        if len(written) == failing:
            raise OSError(28, "No space left on device")
        return write(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing_write)
    reader = pa.RecordBatchReader.from_batches(SCHEMA, _batches(4 * ROW_GROUP_ROWS, 1000))
    with pytest.raises(OSError, match="No space left"):
        write_predictions(reader, tmp_path / "p.parquet", id_field="id", trainer=TRAINER)
    assert list(tmp_path.iterdir()) == []
    assert len(written) == failing  # no row group handed on after the failure was seen


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
