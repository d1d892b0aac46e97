"""Each link of the chain as a function: its body called on in-memory objects, with Dagster's
asset context and resource instances, and no instance, run or IO manager (project_fully_featured
tests its assets this way).

The wine sample goes link by link here: the manifest read, the verified snapshot, the index, the
training run, the predictions and the output bundle, and each check on what its link returned.
``tests/chain/test_chain.py`` runs the one end-to-end chain through Dagster, on digits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets import (
    disjoint_index,
    index_disjoint_and_covering,
    iterated_counts_reconcile,
    manifest_binds_every_file,
    one_row_per_item,
    output_bundle,
    output_bundle_verifies,
    prediction_table,
    result_manifest,
    training_run,
    verified_snapshot,
)
from assets._metadata import plain
from assets.result_manifest import COMPLETE, ResultManifestConfig
from pipeline.bundle.verify import VerifiedSnapshot, verify
from pipeline.training.predictions import PredictionFile, write_predictions
from pipeline.training.record import OutputRecord, TrainedModel, read_record
from resources.bundle_store import SourceBundle
from resources.compute.local import LocalCompute
from resources.dagster.artifacts import ArtifactStore
from tests.helpers.chain import FAST_TRAINING


class RunlessArtifacts(ArtifactStore):
    """The artifact store for a body called directly: there is no run, so one folder per asset."""

    def directory(self, context: dg.AssetExecutionContext) -> Path:
        d = self.path(context.asset_key, "direct")
        d.mkdir(parents=True, exist_ok=True)
        return d


def _values(output: dg.Output) -> dict:
    """An output's metadata as plain values (digests without their display formatting)."""
    return {
        k: plain(v) if k.endswith("sha256") else getattr(v, "value", v)
        for k, v in output.metadata.items()
    }


@dataclass
class Links:
    """What each link of the wine chain returned, called one after the other."""

    resources: dict
    check: dg.AssetCheckResult
    manifest: dg.Output
    snapshot: dg.Output
    index: dg.Output
    training: dg.Output
    predictions: dg.Output
    output: dg.Output


@pytest.fixture(scope="module")
def links(labelled_samples, tmp_path_factory) -> Links:
    home = tmp_path_factory.mktemp("links")
    res = labelled_samples.resources(home, "wine")
    res["artifacts"] = RunlessArtifacts(root=str(home / "artifacts"))
    store, settings = res["bundle_store"], res["chain_settings"]
    check, manifest = result_manifest(
        dg.build_asset_context(),
        config=ResultManifestConfig(),
        compute=res["compute"],
        bundle_store=store,
        chain_settings=settings,
    )
    snapshot = verified_snapshot(
        dg.build_asset_context(), result_manifest=manifest.value, bundle_store=store
    )
    index = disjoint_index(verified_snapshot=snapshot.value, chain_settings=settings)
    training = training_run(
        dg.build_asset_context(),
        config=FAST_TRAINING.ops["training_run"],
        disjoint_index=index.value,
        chain_settings=settings,
        artifacts=res["artifacts"],
        bundle_store=store,
        pipes_subprocess_client=res["pipes_subprocess_client"],
    )
    predictions = prediction_table(
        dg.build_asset_context(),
        training_run=training.value,
        chain_settings=settings,
        artifacts=res["artifacts"],
    )
    output = output_bundle(
        dg.build_asset_context(),
        prediction_table=predictions.value,
        training_run=training.value,
        bundle_store=store,
        chain_settings=settings,
        artifacts=res["artifacts"],
    )
    return Links(res, check, manifest, snapshot, index, training, predictions, output)


def test_the_manifest_is_read_first_and_the_complete_version_passes_its_check(
    links, labelled_samples
):
    compute = LocalCompute(labelled_samples.compute_root)
    job = labelled_samples.jobs["wine"]
    latest = verify(compute.manifest_url(job))
    assert links.check.check_name == COMPLETE and links.check.passed
    assert links.check.description == "complete"
    source = links.manifest.value
    assert isinstance(source, SourceBundle) and source.manifest.snapshot == latest.identity
    meta = _values(links.manifest)
    assert meta["job_id"] == job and meta["job_status"] == "SUCCEEDED"
    assert meta["snapshot/content_sha256"] == latest.identity.content_sha256
    assert meta["accepted"] + meta["failed"] + meta["abstained"] == meta["items"] == 178
    assert links.manifest.data_version == dg.DataVersion(latest.identity.content_sha256)


def test_the_snapshot_is_fetched_into_the_cache_and_verified(links):
    snap = links.snapshot.value
    assert isinstance(snap, VerifiedSnapshot)
    cache = Path(links.resources["bundle_store"].cache_dir).resolve()
    assert cache in snap.root.parents  # the cached view, not Compute's own copy
    meta = _values(links.snapshot)
    assert meta["bytes_hashed"] == meta["bytes_total"] > 0  # all new to this cache
    assert meta["snapshot/content_sha256"] == links.manifest.value.manifest.snapshot.content_sha256
    binds = manifest_binds_every_file(
        verified_snapshot=snap.root, bundle_store=links.resources["bundle_store"]
    )
    assert binds.passed and binds.metadata["violations"].value == 0
    assert binds.metadata["bytes_hashed"].value == 0  # the cache vouches for what it hashed


def test_the_index_covers_the_snapshot_once(links):
    index = links.index.value
    assert len(index) == 178 and index.snapshot.identity == links.snapshot.value.identity
    assert _values(links.index)["index_sha256"] == index.digest
    covering = index_disjoint_and_covering(
        disjoint_index=index, chain_settings=links.resources["chain_settings"]
    )
    assert covering.passed and covering.metadata["problems"].value == "none"


def test_the_training_run_records_the_data_and_code_beside_its_checkpoint(links):
    model = links.training.value
    assert isinstance(model, TrainedModel)
    meta = _values(links.training)
    record = read_record(meta["record"])
    assert record == model.record
    assert record.trainer.path == "pipeline.training.reference:ReferenceTrainer"
    assert record.trainer.source_sha256 and record.features.used
    assert "lithi_label" not in record.features.used and "wine_id" not in record.features.used
    assert list(record.checkpoint.files) == ["model.pt"]
    assert meta["record_json"] == json.loads(Path(meta["record"]).read_text())
    assert record.snapshot == links.snapshot.value.identity
    assert record.index_sha256 == meta["index_sha256"] == links.index.value.digest
    assert meta["checkpoint_sha256"] == record.checkpoint.sha256
    assert meta["trainer_config"] == record.config  # the effective config, on the asset page
    assert record.reconciliation.ok and record.reconciliation.items_iterated == 178
    assert meta["holdout_accuracy"] > 0.5
    # every metric is a float, an item count or an accuracy of exactly 1.0 included
    for name in record.metrics:
        assert isinstance(links.training.metadata[name], dg.FloatMetadataValue), name
    assert iterated_counts_reconcile(training_run=model).passed


def test_one_prediction_per_item_keyed_by_the_same_string_ids(links, tmp_path):
    written = links.predictions.value
    assert isinstance(written, PredictionFile)
    table = written.read()
    index = links.index.value
    assert table.num_rows == len(index) == written.rows
    ids = table.column(index.id_field)
    assert ids.type == pa.string() and sorted(ids.to_pylist()) == sorted(index.ids.to_pylist())
    checkpoint = links.training.value.record.checkpoint.sha256
    assert set(table.column("checkpoint_sha256").to_pylist()) == {checkpoint}
    assert one_row_per_item(prediction_table=written, training_run=links.training.value).passed
    # a table missing a row is caught, naming the item
    short = write_predictions(
        table.slice(1), tmp_path / "short.parquet", id_field=index.id_field, trainer="test"
    )
    missed = one_row_per_item(prediction_table=short, training_run=links.training.value)
    assert not missed.passed
    assert ids[0].as_py() in missed.metadata["problems"].value


def test_the_output_bundle_verifies_and_its_record_binds_the_training_record(links):
    published = links.output.value
    training = links.training.value
    out = verify(published.root)
    assert out.manifest.kind == "prediction"
    assert out.manifest.input.snapshot == training.record.snapshot
    assert out.manifest.counts.items == 178
    meta = _values(links.output)
    assert meta["bundle/content_sha256"] == out.identity.content_sha256
    record = read_record(meta["record"], OutputRecord)
    assert record.output == out.identity and record.training == training.record
    assert Path(record.training_record) == training.record_path
    assert Path(meta["record"]).parent != training.record_path.parent
    verifies = output_bundle_verifies(
        output_bundle=published.root,
        training_run=training,
        bundle_store=links.resources["bundle_store"],
    )
    assert verifies.passed and verifies.metadata["names_training_snapshot"].value
    assert pq.read_table(out.part_paths()[0]).num_rows > 0
