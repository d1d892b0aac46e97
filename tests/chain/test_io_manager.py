"""The chain's IO manager: objects go in, verified objects come out, tampering is caught.

Each test materializes part of the chain, then loads an asset in a later run (through the
latest materialization, as Dagster does across runs) after changing what is on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from assets import (
    disjoint_index,
    prediction_table,
    result_manifest,
    training_run,
    verified_snapshot,
)
from assets.training_run import TrainingConfig
from pipeline.bundle.digest import file_bytes_hashed
from pipeline.bundle.errors import DigestMismatch
from resources.dagster.io_manager import StaleArtifact
from tests.helpers.bundles import edit_in_place
from tests.helpers.chain import FAST_TRAINING

UP_TO_TRAINING = [result_manifest, verified_snapshot, disjoint_index, training_run]


@pytest.fixture
def trained(tmp_path, labelled_samples):
    """A wine chain materialized up to ``training_run``, and the instance that recorded it."""
    resources = labelled_samples.resources(tmp_path, "wine")
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            UP_TO_TRAINING, resources=resources, run_config=FAST_TRAINING, instance=instance
        )
        assert result.success
        meta = result.asset_materializations_for_node("training_run")[0].metadata
        yield instance, resources, Path(meta["checkpoint"].value) / "model.pt"


def _predict_in_a_new_run(instance, resources) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [prediction_table, *UP_TO_TRAINING],
        selection=[prediction_table],
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )


def test_a_later_run_loads_the_latest_materialization_without_hashing_again(trained):
    instance, resources, checkpoint = trained
    before = file_bytes_hashed()
    result = _predict_in_a_new_run(instance, resources)
    assert result.success
    assert file_bytes_hashed() == before  # snapshot and checkpoint trusted, both unchanged
    assert not checkpoint.stat().st_mode & 0o222  # kept read-only


def _change(path: Path, covered: bool, at: int) -> None:
    """Change one byte of ``path``: plainly, or in place with the mtime put back."""
    if covered:
        edit_in_place(path, at)
        return
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


TRACKS = pytest.mark.parametrize("covered", [False, True], ids=["rewritten", "mtime-put-back"])


@TRACKS
def test_a_checkpoint_changed_after_training_is_refused(trained, covered):
    instance, resources, checkpoint = trained
    _change(checkpoint, covered, checkpoint.stat().st_size - 1)
    result = _predict_in_a_new_run(instance, resources)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error.cause.cls_name == DigestMismatch.__name__
    assert "the checkpoint changed after training" in error.cause.message


@TRACKS
def test_a_cached_part_changed_after_verification_is_refused(trained, covered):
    instance, resources, _ = trained
    cache = Path(resources["bundle_store"].cache_dir)
    part = next((cache / "bundles").glob("*/parts/part-00000.parquet"))
    _change(part, covered, 100)
    result = _predict_in_a_new_run(instance, resources)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error.cause.cls_name == DigestMismatch.__name__
    assert "sha256 expected" in error.cause.message and "part-00000.parquet" in error.cause.message


def test_the_training_config_round_trips_as_run_config():
    config = TrainingConfig(epochs=2, reader="iterable", features=["x"])
    as_dict = dg.RunConfig(ops={"training_run": config}).to_config_dict()
    assert as_dict["ops"]["training_run"]["config"] == config.model_dump()


@TRACKS
def test_predictions_load_whole_for_a_table_input_and_a_changed_file_is_refused(trained, covered):
    """A user's own asset that takes ``prediction_table`` as a ``pa.Table`` gets the table the
    step streamed to disk; once that file has changed, it gets a refusal instead."""
    instance, resources, _ = trained
    predicted = _predict_in_a_new_run(instance, resources)
    assert predicted.success
    meta = predicted.asset_materializations_for_node("prediction_table")[0].metadata
    seen: dict[str, int] = {}

    @dg.asset
    def my_report(prediction_table: pa.Table) -> None:
        seen["rows"] = prediction_table.num_rows

    def report() -> dg.ExecuteInProcessResult:
        return dg.materialize(
            [my_report, prediction_table, *UP_TO_TRAINING],
            selection=[my_report],
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )

    assert report().success
    assert seen["rows"] == meta["dagster/row_count"].value > 0
    path = Path(meta["table_path"].value)
    _change(path, covered, path.stat().st_size // 2)
    refused = report()
    assert not refused.success
    error = refused.get_step_failure_events()[0].step_failure_data.error
    assert error.cause.cls_name == StaleArtifact.__name__
    assert "changed since it was written" in error.cause.message
