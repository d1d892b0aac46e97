"""``result_manifest``: the manifest of one Compute result version, read first and nothing else."""

import dagster as dg

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from resources.bundle_store import SourceBundle
from resources.compute.client import ComputeError, ComputeUnavailable
from resources.dagster_resources import BundleStoreResource, ComputeResource
from resources.settings import ChainSettings


class ResultManifestConfig(dg.Config):
    """Which result to read; empty values mean the configured job's latest version."""

    job_id: str = ""
    version_id: str = ""
    allow_partial: bool = False


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"python", "json"},
    code_version="2",
)
def result_manifest(
    context: dg.AssetExecutionContext,
    config: ResultManifestConfig,
    compute: ComputeResource,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
) -> dg.Output[SourceBundle]:
    """The Compute job's ``result-manifest.json``, read first: it binds every file, count and
    schema of the bundle. A PARTIAL result is refused unless ``allow_partial`` is set."""
    try:
        client = compute.client()
        job_id = config.job_id or chain_settings.resolve_job(client)
        if not job_id:
            raise dg.Failure("no Compute job to read: set LITHI_JOB_ID or submit a job first")
        status = client.status(job_id)
        version = config.version_id or status.latest_version_id
        if version is None:
            raise dg.Failure(f"Compute job {job_id} has published no result yet ({status.state})")
        url = client.manifest_url(job_id, version)
    except (ComputeError, ComputeUnavailable) as e:
        raise dg.Failure(str(e)) from None
    source = bundle_store.store().source(url, credential_ref=chain_settings.credential_ref or None)
    manifest = source.manifest
    if manifest.is_partial and not config.allow_partial:
        raise dg.Failure(
            f"{url}: {job_id} version {version} is PARTIAL with {manifest.counts.outstanding} "
            "items outstanding, so nothing is trained; the sensor resubmits them where a Compute "
            "service can. Set allow_partial to train on the accepted parts anyway.",
            metadata={"outstanding": manifest.counts.outstanding},
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
    return dg.Output(
        source, metadata=meta, data_version=dg.DataVersion(manifest.snapshot.content_sha256)
    )
