"""``result_manifest``: the manifest of one Compute result version, read first and nothing else."""

import dagster as dg

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from assets.chain_keys import chain_of
from assets.compute_versions import compute_versions
from resources.compute.client import ComputeError, ComputeUnavailable
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource, source_client


class ResultManifestConfig(dg.Config):
    """Which result to read; empty values mean the configured job's latest version."""

    job_id: str = ""
    version_id: str = ""
    allow_partial: bool = False


COMPLETE = "result_manifest_complete"


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"python", "json"},
    code_version="3",
    deps=[compute_versions],
    check_specs=[
        dg.AssetCheckSpec(
            COMPLETE,
            asset="result_manifest",
            blocking=True,
            description="The version is complete (not PARTIAL), or the run allowed training on "
            "a PARTIAL version's accepted parts; a PARTIAL version is recorded, and stops here.",
        )
    ],
)
def result_manifest(
    context: dg.AssetExecutionContext,
    config: ResultManifestConfig,
    compute: ComputeResource,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
):
    """The Compute job's ``result-manifest.json``, read first: it binds every file, count and
    schema of the bundle. A PARTIAL version is recorded too; its blocking check stops the chain
    there unless ``allow_partial`` is set."""
    chain_settings = chain_settings.for_chain(chain_of(context.asset_key))
    try:
        client = source_client(compute, bundle_store, chain_settings)
        job_id = config.job_id or chain_settings.resolve_job(client)
        if not job_id:
            raise dg.Failure("no Compute job to read: set LITHI_JOB_ID or submit a job first")
        status = client.status(job_id)
        version = config.version_id or status.latest_version_id
        if version is None:
            raise dg.Failure(f"Compute job {job_id} has published no result yet ({status.state})")
        url = client.bundle_url(job_id, version)
    except (ComputeError, ComputeUnavailable) as e:
        raise dg.Failure(str(e)) from None
    source = bundle_store.store().source(url, credential_ref=chain_settings.credential_ref or None)
    manifest = source.manifest
    complete = not manifest.is_partial or config.allow_partial
    yield dg.AssetCheckResult(
        check_name=COMPLETE,
        passed=complete,
        description=(
            "complete"
            if not manifest.is_partial
            else "PARTIAL, training on the accepted parts was allowed"
            if complete
            else f"{url}: {job_id} version {version} is PARTIAL with "
            f"{manifest.counts.outstanding} items outstanding, so nothing is trained; the sensor "
            "resubmits them where a Compute service can. Set allow_partial to train on the "
            "accepted parts anyway."
        ),
        metadata={
            "outstanding": manifest.counts.outstanding or 0,
            "allow_partial": config.allow_partial,
        },
    )
    job = manifest.job
    meta = {
        **md.identity("snapshot", manifest.snapshot),
        **md.counts(manifest),
        "dagster/column_schema": md.column_schema(manifest.schema_, manifest.item_id_field),
        "job_id": job_id,
        "job_status": job.status if job else "n/a",
        "attempt": job.attempt if job else 0,
        "parent_version_id": (job.parent_version_id if job else None) or "",
        "manifest_url": dg.MetadataValue.url(url) if "://" in url else dg.MetadataValue.path(url),
        "item_id_field": manifest.item_id_field,
        "parts": md.markdown_table(
            ["path", "rows", "bytes", "sha256"],
            [[p.path, p.rows, p.bytes, p.sha256[:16] + "…"] for p in manifest.parts],
        ),
    }
    if manifest.input is not None:
        meta.update(md.identity("input", manifest.input.snapshot))
    context.log.info(
        f"{job_id} version {version}: {manifest.counts.items} items, {meta['job_status']}"
    )
    md.tag_run(context, {"lithi/snapshot_sha256": manifest.snapshot.content_sha256})
    yield dg.Output(
        source, metadata=meta, data_version=dg.DataVersion(manifest.snapshot.content_sha256)
    )
