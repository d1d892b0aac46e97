"""The one end-to-end chain of the fast tier: digits, materialized in-process through Dagster
against a temporary instance, every link and check, hashing each bundle once.

The links one by one, on wine, are ``tests/chain/test_assets.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from assets import CHAIN_ASSETS, CHAIN_CHECKS
from assets._metadata import plain
from pipeline.bundle.digest import file_bytes_hashed
from pipeline.bundle.verify import verify
from pipeline.cli import main as bundle_cli
from pipeline.training.record import OutputRecord, read_record
from resources.compute.local import LocalCompute
from tests.helpers.chain import FAST_TRAINING


def _meta(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    """An asset's metadata as plain values (digests without their display formatting)."""
    mats = result.asset_materializations_for_node(asset)
    assert len(mats) == 1
    return {
        k: plain(v) if k.endswith("sha256") else getattr(v, "value", v)
        for k, v in mats[0].metadata.items()
    }


def test_the_digits_chain_materializes_end_to_end_hashing_each_bundle_once(
    tmp_path, labelled_samples, capsys
):
    job = labelled_samples.jobs["digits"]
    result_bytes = verify(LocalCompute(labelled_samples.compute_root).manifest_url(job))
    before = file_bytes_hashed()
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [*CHAIN_ASSETS, *CHAIN_CHECKS],
            resources=labelled_samples.resources(tmp_path, "digits"),
            run_config=FAST_TRAINING,
            instance=instance,
        )
        run_tags = instance.get_run_by_id(result.run_id).tags
    hashed = file_bytes_hashed() - before
    assert result.success
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks == dict.fromkeys(
        [
            "result_manifest_complete",
            "manifest_binds_every_file",
            "index_disjoint_and_covering",
            "iterated_counts_reconcile",
            "model_is_current",
            "one_row_per_item",
            "output_bundle_verifies",
        ],
        True,
    )

    manifest = _meta(result, "result_manifest")
    snapshot = _meta(result, "verified_snapshot")
    training = _meta(result, "training_run")
    predictions = _meta(result, "prediction_table")
    output = _meta(result, "output_bundle")

    # every digest whole on the run, where it can be copied and filtered by
    assert run_tags["lithi/snapshot_sha256"] == manifest["snapshot/content_sha256"]
    assert run_tags["lithi/checkpoint_sha256"] == training["checkpoint_sha256"]
    assert run_tags["lithi/output_sha256"] == output["bundle/content_sha256"]
    assert len(run_tags["lithi/checkpoint_sha256"]) == 64
    assert training["torch_threads"] == 1  # tests/helpers/chain.py sets one thread per rank
    # One identity flows down the chain.
    sha = manifest["snapshot/content_sha256"]
    assert snapshot["snapshot/content_sha256"] == sha == training["snapshot/content_sha256"]
    assert output["input/content_sha256"] == sha
    assert manifest["accepted"] + manifest["failed"] + manifest["abstained"] == manifest["items"]

    # The record beside the checkpoint names the data and the code that produced it; the UI
    # shows the file as it is.
    record = read_record(training["record"])
    assert record.trainer.path == "pipeline.training.reference:ReferenceTrainer"
    assert record.trainer.source_sha256 and record.features.used
    assert list(record.checkpoint.files) == ["model.pt"]
    assert training["record_json"] == json.loads(Path(training["record"]).read_text())
    assert record.snapshot.content_sha256 == sha
    assert record.index_sha256 == training["index_sha256"]
    assert record.reconciliation.ok is True
    assert record.reconciliation.items_iterated == manifest["items"]

    # The output bundle's own record binds it to that training record, which nobody rewrote.
    out_record = read_record(output["record"], OutputRecord)
    assert out_record.output.content_sha256 == output["bundle/content_sha256"]
    assert out_record.training == record
    assert Path(out_record.training_record) == Path(training["record"])
    assert Path(output["record"]).parent != Path(training["record"]).parent

    # One prediction row per item, keyed by the same string ids, failed/abstained included.
    table = pq.read_table(predictions["table_path"])
    src = verify(snapshot["bundle_path"])
    id_field = src.manifest.item_id_field
    assert table.num_rows == manifest["items"]
    assert len(set(table.column(id_field).to_pylist())) == table.num_rows
    assert table.column(id_field).type == "string"
    first_id = pq.read_table(src.part_paths()[0], columns=[id_field]).column(0)[0].as_py()
    assert first_id in set(table.column(id_field).to_pylist())
    assert set(table.column("checkpoint_sha256").to_pylist()) == {record.checkpoint.sha256}

    # The output bundle passes `lithi-bundle verify` and names the training snapshot as input.
    assert bundle_cli(["verify", "--json", output["bundle_path"]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True
    out = verify(output["bundle_path"])
    assert out.manifest.kind == "prediction"
    assert out.manifest.input.content_sha256 == sha
    assert training["holdout_accuracy"] > 0.5

    # The result bundle once on arrival in the cache, the output bundle once as it is staged,
    # the checkpoint once as it is written; every later load verifies with trust.
    checkpoint_dir = Path(training["checkpoint"])
    checkpoint = sum(p.stat().st_size for p in checkpoint_dir.rglob("*") if p.is_file())
    expected = result_bytes.stats.bytes_total + out.stats.bytes_total + checkpoint
    print(
        f"\nbytes hashed by one chain run: {hashed} (result bundle "
        f"{result_bytes.stats.bytes_total}, output bundle {out.stats.bytes_total}, "
        f"checkpoint {checkpoint})"
    )
    assert hashed == expected
