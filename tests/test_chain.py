"""The asset chain materialized in-process against a temporary instance, on two data sets."""

from __future__ import annotations

import json

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets import CHAIN_ASSETS
from pipeline.bundle.verify import verify
from pipeline.cli import main as bundle_cli
from pipeline.training.record import read_record
from tests.helpers.chain import FAST_TRAINING


def _meta(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    mats = result.asset_materializations_for_node(asset)
    assert len(mats) == 1
    return {k: getattr(v, "value", v) for k, v in mats[0].metadata.items()}


@pytest.mark.parametrize("sample", ["digits", "wine"])
def test_chain_materializes_end_to_end(tmp_path, sample, labelled_samples, capsys):
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            CHAIN_ASSETS,
            resources=labelled_samples.resources(tmp_path, sample),
            run_config=FAST_TRAINING,
            instance=instance,
        )
    assert result.success
    for check in result.get_asset_check_evaluations():
        assert check.passed, check.check_name

    manifest = _meta(result, "result_manifest")
    snapshot = _meta(result, "verified_snapshot")
    training = _meta(result, "training_run")
    predictions = _meta(result, "prediction_table")
    output = _meta(result, "output_bundle")

    # One identity flows down the chain.
    sha = manifest["snapshot/content_sha256"]
    assert snapshot["snapshot/content_sha256"] == sha == training["snapshot/content_sha256"]
    assert output["input/content_sha256"] == sha
    assert manifest["accepted"] + manifest["failed"] + manifest["abstained"] == manifest["items"]

    # The record beside the checkpoint names the data that produced it and what it produced.
    record = read_record(training["record"])
    assert record.snapshot.content_sha256 == sha
    assert record.index_sha256 == training["index_sha256"]
    assert record.output_bundle is not None
    assert record.output_bundle.content_sha256 == output["bundle/content_sha256"]
    assert record.reconciliation["ok"] is True
    assert record.reconciliation["items_iterated"] == manifest["items"]

    # One prediction row per item, keyed by the same string ids, failed/abstained included.
    table = pq.read_table(predictions["table_path"])
    src = verify(snapshot["bundle_path"])
    src_ids = pq.read_table(src.part_paths()[0], columns=[src.manifest.item_id_field])
    id_field = src.manifest.item_id_field
    assert table.num_rows == manifest["items"]
    assert len(set(table.column(id_field).to_pylist())) == table.num_rows
    assert table.column(id_field).type == "string"
    assert src_ids.column(0)[0].as_py() in set(table.column(id_field).to_pylist())
    assert set(table.column("checkpoint_sha256").to_pylist()) == {record.checkpoint_sha256}

    # The output bundle passes `lithi-bundle verify` and names the training snapshot as input.
    assert bundle_cli(["verify", "--json", output["bundle_path"]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True
    out = verify(output["bundle_path"])
    assert out.manifest.kind == "prediction"
    assert out.manifest.input.content_sha256 == sha
    assert training["holdout_accuracy"] > 0.5
