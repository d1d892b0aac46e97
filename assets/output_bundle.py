"""``output_bundle``: the prediction table staged as its own immutable bundle."""

from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from assets import _metadata as md
from assets._group import CHAIN_GROUP
from assets.refs import OutputRef, PredictionRef
from pipeline.bundle.manifest import InputRef
from pipeline.bundle.stage import new_version_id, stage
from pipeline.bundle.verify import check
from pipeline.training.record import OutputBundleRecord, read_record, write_record
from resources.settings import ChainSettings

VERIFIES = "output_bundle_verifies"


@dg.asset(
    group_name=CHAIN_GROUP,
    kinds={"parquet"},
    code_version="1",
    description="The prediction table staged as an immutable bundle (kind prediction) whose input "
    "is the training snapshot; its identity is written into the record beside the checkpoint.",
    check_specs=[
        dg.AssetCheckSpec(
            VERIFIES,
            asset="output_bundle",
            description="The staged bundle verifies and names the training snapshot as its input.",
        )
    ],
)
def output_bundle(
    context: dg.AssetExecutionContext,
    prediction_table: PredictionRef,
    chain_settings: ChainSettings,
):
    """Stage the predictions, then record the bundle identity beside the checkpoint."""
    training = prediction_table.training
    snap = training.index.snapshot
    table = pq.read_table(prediction_table.path)
    version = new_version_id("prediction")
    dest = chain_settings.artifacts() / "bundles" / version
    staged = stage(
        table,
        dest,
        id_field=prediction_table.id_field,
        kind="prediction",
        version_id=version,
        input=InputRef(
            version_id=snap.identity.version_id,
            content_sha256=snap.identity.content_sha256,
            credential_ref=snap.credential_ref,
        ),
    )
    manifest, errors, _ = check(dest)
    names_input = (
        manifest is not None
        and manifest.input is not None
        and (manifest.input.snapshot == snap.identity)
    )
    yield dg.AssetCheckResult(
        check_name=VERIFIES,
        passed=not errors and names_input,
        metadata={
            "violations": "\n".join(f"{type(e).__name__}: {e}" for e in errors) or "none",
            "names_training_snapshot": names_input,
        },
    )
    record = read_record(training.record)
    record.output_bundle = OutputBundleRecord(
        version_id=staged.identity.version_id,
        content_sha256=staged.identity.content_sha256,
        path=str(dest),
    )
    write_record(Path(training.record).parent, record)
    context.log.info(f"staged {staged.identity.version_id} ({staged.identity.content_sha256})")
    yield dg.Output(
        OutputRef(path=str(dest), identity=staged.identity),
        metadata={
            **md.identity("bundle", staged.identity),
            **md.identity("input", snap.identity),
            **md.counts(staged.manifest),
            "bundle_path": dg.MetadataValue.path(str(dest)),
            "checkpoint_sha256": training.checkpoint_sha256,
            "record": dg.MetadataValue.path(training.record),
        },
        data_version=dg.DataVersion(staged.identity.content_sha256),
    )
