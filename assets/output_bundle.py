"""``output_bundle``: the prediction table staged as its own immutable bundle, with its record."""

from pathlib import Path

import dagster as dg

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from assets.chain_keys import chain_of
from pipeline.bundle.atomic import atomic_write_text
from pipeline.bundle.errors import BundleError
from pipeline.bundle.manifest import InputRef
from pipeline.bundle.stage import new_version_id, stage
from pipeline.bundle.verify import VerifiedSnapshot, check
from pipeline.training.predictions import PredictionFile
from pipeline.training.record import (
    CHECKPOINT_DIR,
    RECORD_NAME,
    OutputRecord,
    TrainedModel,
    write_record,
)
from resources.bundle_store import BundleStore
from resources.dagster.artifacts import ArtifactStore
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource

VERIFIES = "output_bundle_verifies"
#: The version a run of this asset is about to publish, in its run folder.
PUBLISHING = "publishing.txt"
#: The training run's record, as published beside its checkpoint (``record.json`` is this asset's)
TRAINING_RECORD = "training-record.json"


@dg.asset(
    group_name=CHAIN_GROUP, io_manager_key=IO_MANAGER_KEY, kinds={"parquet"}, code_version="2"
)
def output_bundle(
    context: dg.AssetExecutionContext,
    prediction_table: PredictionFile,
    training_run: TrainedModel,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
    artifacts: ArtifactStore,
) -> dg.Output[VerifiedSnapshot]:
    """The prediction table staged as an immutable bundle (kind prediction) whose input is the
    training snapshot, published into the bundle store; a record beside it binds the bundle to
    the training record (snapshot, index digest, checkpoint digest). With ``LITHI_PUBLISH_URL``
    the bundle is also uploaded to ``<publish_url>/<version_id>/`` (parts first, manifest last)
    and the training artifacts to ``<publish_url>/<version_id>.training/`` (the checkpoint, the
    training record, then this record, last)."""
    training = training_run.record
    chain_settings = chain_settings.for_chain(chain_of(context.asset_key))
    store = bundle_store.store()
    _retire_unrecorded(context, artifacts, store)
    version = new_version_id("prediction")
    # said before anything is published, so the next run can tell if this one never recorded it
    atomic_write_text(artifacts.directory(context) / PUBLISHING, version + "\n")
    staged = stage(
        prediction_table.iter_batches(),  # row groups as they were written, never whole
        store.staging_path(version),
        schema=prediction_table.schema,
        id_field=training_run.index.id_field,
        kind="prediction",
        version_id=version,
        input=InputRef(
            version_id=training.snapshot.version_id,
            content_sha256=training.snapshot.content_sha256,
            credential_ref=chain_settings.credential_ref or None,
        ),
    )
    published = store.publish(staged)
    base = chain_settings.publish_url.rstrip("/")
    ref = chain_settings.publish_credential_ref or None
    remote = None
    if base:
        url = f"{base}/{version}"
        try:
            remote = store.upload(published, url, credential_ref=ref)
        except (BundleError, OSError, ValueError, ImportError) as e:  # refused, unreachable
            raise dg.Failure(f"output bundle {version} could not be published to {url}: {e}") from e
        context.log.info(
            f"published {version} to {url}: {remote.files_uploaded} files uploaded, "
            f"{remote.files_present} already there"
        )
    training_url = f"{base}/{version}.training" if base else None
    record_path = write_record(
        artifacts.directory(context),
        OutputRecord(
            output=published.identity,
            bundle_path=str(published.root),
            training_record=str(training_run.record_path),
            training=training,
            published_url=remote.url if remote else None,
            published_training_url=training_url,
        ),
    )
    if training_url:
        checkpoint = training.checkpoint.files
        files = {f"{CHECKPOINT_DIR}/{rel}": training_run.checkpoint_dir / rel for rel in checkpoint}
        files |= {TRAINING_RECORD: training_run.record_path, RECORD_NAME: record_path}
        try:
            store.upload_files(
                files,
                training_url,
                last=RECORD_NAME,
                digests={f"{CHECKPOINT_DIR}/{rel}": sha for rel, sha in checkpoint.items()},
                credential_ref=ref,
            )
        except (BundleError, OSError, ValueError, ImportError) as e:  # refused, unreachable
            raise dg.Failure(
                f"the training artifacts of {version} could not be published to {training_url}: {e}"
            ) from e
    context.log.info(
        f"staged {published.identity.version_id} ({published.identity.content_sha256})"
    )
    md.tag_run(context, {"lithi/output_sha256": published.identity.content_sha256})
    return dg.Output(
        published,
        metadata={
            **md.identity("bundle", published.identity),
            **md.identity("input", training.snapshot),
            **md.counts(published.manifest),
            "bundle_path": dg.MetadataValue.path(str(published.root)),
            "checkpoint_sha256": md.digest(training.checkpoint.sha256),
            "record": dg.MetadataValue.path(str(record_path)),
            "training_record": dg.MetadataValue.path(str(training_run.record_path)),
            **({"published_url": dg.MetadataValue.url(remote.url)} if remote else {}),
            **({"published_training_url": dg.MetadataValue.url(training_url)} if base else {}),
        },
        data_version=dg.DataVersion(published.identity.content_sha256),
    )


@dg.asset_check(
    asset=output_bundle,
    additional_ins={"training_run": dg.AssetIn("training_run")},
    description="The bundle on disk verifies (with the store's trust), names the training "
    "snapshot as its input, and holds one row per item of the training index.",
)
def output_bundle_verifies(
    output_bundle: Path, training_run: TrainedModel, bundle_store: BundleStoreResource
) -> dg.AssetCheckResult:
    """Re-check the published bundle independently of the step that wrote it."""
    result = check(output_bundle, trusted=bundle_store.store().trusted)
    manifest, errors, stats = result.manifest, result.errors, result.stats
    names_input = (
        manifest is not None
        and manifest.input is not None
        and manifest.input.snapshot == training_run.record.snapshot
    )
    items = manifest.counts.items if manifest is not None else 0
    return dg.AssetCheckResult(
        passed=not errors and names_input and items == len(training_run.index),
        metadata={
            "violations": "\n".join(f"{type(e).__name__}: {e}" for e in errors) or "none",
            "names_training_snapshot": names_input,
            "items": items,
            "index_items": len(training_run.index),
            "bytes_hashed": stats.bytes_hashed if stats else 0,
        },
    )


def _retire_unrecorded(
    context: dg.AssetExecutionContext, artifacts: ArtifactStore, store: BundleStore
) -> None:
    """Retire what an earlier run published and never recorded (killed in between).

    Each run says in its folder which version it is about to publish (:data:`PUBLISHING`). For
    every other run of this asset that has ended without a materialization of it, that
    version's view is removed from the cache; a run still going is left alone.
    """
    for said in sorted(artifacts.path(context.asset_key, "").glob(f"*/{PUBLISHING}")):
        run_id = said.parent.name
        if run_id == context.run.run_id:
            continue
        run = context.instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            continue  # still running: what it publishes may yet be recorded
        events = context.instance.all_logs(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        )
        recorded = any(
            e.dagster_event is not None and e.dagster_event.asset_key == context.asset_key
            for e in events
        )
        version = said.read_text().strip()
        if not recorded and store.retire(version):
            context.log.warning(
                f"retired {version}: run {run_id} published it and ended without recording it"
            )
        said.unlink()
