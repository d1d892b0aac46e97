"""``compute_versions``: every result version Compute published, as Dagster observes it.

An external asset (the versions live in Compute, not here) upstream of ``result_manifest``. The
sensor records one observation per version the moment it sees it — PARTIAL ones included — with
its counts by status, content digest, parent, outstanding items and what changed since its
parent, so "what did the resubmission change?" is answered on this asset's page. Each
observation carries the version's content digest as its data version, so a newer version marks
``result_manifest`` and everything downstream stale until the chain is rebuilt from it.
"""

from __future__ import annotations

import warnings

import dagster as dg

from assets import _metadata as md
from assets._group import CHAIN_GROUP
from assets.chain_keys import chain_of
from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import Manifest
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource, source_client

KEY = dg.AssetKey("compute_versions")
#: The tag Dagster reads an observation's data version from (what ``ObserveResult`` writes).
DATA_VERSION_TAG = "dagster/data_version"
COUNTS = ("items", *fmt.STATUSES, "outstanding")


def delta(manifest: Manifest, parent: Manifest | None) -> dict[str, int]:
    """How each count moved from the parent version to this one (all zero for a first one)."""
    now = manifest.counts.model_dump()
    before = parent.counts.model_dump() if parent is not None else now
    return {c: (now.get(c) or 0) - (before.get(c) or 0) for c in COUNTS}


def observation(
    job_id: str, manifest: Manifest, url: str, parent: Manifest | None, key: dg.AssetKey = KEY
) -> dg.AssetObservation:
    """The observation of one published version: identity, counts, and the change from its
    parent, as metadata a person reads (and Dagster plots) on the page of ``key`` (a chain's
    ``compute_versions``)."""
    job = manifest.job
    counts = manifest.counts.model_dump()
    moved = delta(manifest, parent)
    change = ", ".join(f"{c} {n:+d}" for c, n in moved.items() if n) or "first version"
    metadata: dict[str, object] = {
        "job_id": job_id,
        "version_id": manifest.snapshot.version_id,
        "status": job.status if job is not None else "n/a",
        "attempt": job.attempt if job is not None else 1,
        "parent_version_id": (job.parent_version_id if job is not None else None) or "none",
        "content_sha256": md.digest(manifest.snapshot.content_sha256),
        **{c: counts.get(c) or 0 for c in COUNTS},
        "change": change,
        **{f"change/{c}": n for c, n in moved.items()},
        "manifest_url": dg.MetadataValue.url(url) if "://" in url else dg.MetadataValue.path(url),
    }
    return dg.AssetObservation(
        asset_key=key,
        description=f"{job_id} {metadata['status']} {manifest.snapshot.version_id}: {change}",
        metadata=metadata,
        tags={DATA_VERSION_TAG: manifest.snapshot.content_sha256},
    )


def compute_versions_asset(key: dg.AssetKey = KEY, group: str = CHAIN_GROUP) -> dg.SourceAsset:
    """The ``compute_versions`` source asset at ``key`` in ``group`` (one per chain)."""
    with warnings.catch_warnings():
        # observable_source_asset is beta in Dagster 1.13: said once here, not on every load
        # of the code location (each code server, each run, `demo --help`)
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _compute_versions_asset(key, group)


def _compute_versions_asset(key: dg.AssetKey, group: str) -> dg.SourceAsset:
    @dg.observable_source_asset(
        key=key,
        group_name=group,
        tags={"dagster/kind/json": ""},  # what ``kinds`` writes; this decorator takes tags only
        # this decorator does not read the function's docstring: the description is here
        description="Every result version the Compute jobs published, PARTIAL ones included: "
        "one observation per version, recorded by the sensor as it sees it, with counts by "
        "status, content digest, parent, outstanding items and what changed since the parent. "
        "Observing it by hand records the latest version of each watched job.",
    )
    def compute_versions(
        context: dg.OpExecutionContext,
        compute: ComputeResource,
        bundle_store: BundleStoreResource,
        chain_settings: ChainSettings,
    ) -> dg.ObserveResult:
        """Observe the latest version of the watched job (the first one if several are)."""
        settings = chain_settings.for_chain(chain_of(key))
        client = source_client(compute, bundle_store, settings)
        jobs = settings.watched_jobs(client)
        if not jobs:
            raise dg.Failure("no Compute job is watched: set LITHI_JOB_ID or submit a job first")
        status = client.status(jobs[0])
        if status.latest_version_id is None:
            raise dg.Failure(f"{jobs[0]} has published no version yet ({status.state})")
        store = bundle_store.store()
        ref = settings.credential_ref or None
        url = client.bundle_url(jobs[0], status.latest_version_id)
        m = store.read_manifest(url, ref)
        # what changed since its parent, as the sensor's observation of it says
        parent_id = m.job.parent_version_id if m.job is not None else None
        parent = None
        if parent_id in status.versions:
            parent = store.read_manifest(client.bundle_url(jobs[0], parent_id), ref)
        seen = observation(jobs[0], m, url, parent, key)
        return dg.ObserveResult(
            metadata=dict(seen.metadata),
            data_version=dg.DataVersion(m.snapshot.content_sha256),
        )

    return compute_versions


compute_versions = compute_versions_asset()
