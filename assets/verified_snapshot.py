"""``verified_snapshot``: the bundle fetched once into the cache, verified against its manifest."""

from pathlib import Path

import dagster as dg

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from pipeline.bundle.errors import BundleError
from pipeline.bundle.verify import VerifiedSnapshot
from resources.bundle_store import SourceBundle
from resources.dagster.clients import BundleStoreResource


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"python", "parquet"},
    code_version="3",
)
def verified_snapshot(
    context: dg.AssetExecutionContext,
    result_manifest: SourceBundle,
    bundle_store: BundleStoreResource,
) -> dg.Output[VerifiedSnapshot]:
    """The result bundle, downloaded once into the content-addressed cache and verified: every
    bound file's bytes, sha256, rows and schema; no unbound file; ids unique strings. Its data
    version is the content digest. Files enter the cache hashed on arrival; parts an earlier
    version already brought are vouched for by the cache, so a rebuild hashes only new bytes."""
    store = bundle_store.store()
    source = result_manifest
    try:
        fetched = store.fetch(source.url, credential_ref=source.credential_ref)
    except BundleError as e:
        raise dg.Failure(f"bundle at {source.url} could not be fetched: {e}") from e
    result = store.check(fetched.path)  # in full, leaving a receipt for the steps after this
    violations = [f"{type(e).__name__}: {e}" for e in result.errors]
    if not result.ok:
        raise dg.Failure(f"bundle {fetched.path} does not verify:\n" + "\n".join(violations))
    snapshot = result.verified()
    manifest, stats = snapshot.manifest, snapshot.stats
    if manifest.snapshot != source.manifest.snapshot:
        raise dg.Failure(
            f"the fetched bundle is {manifest.snapshot}, but result_manifest read "
            f"{source.manifest.snapshot}"
        )
    hashed = fetched.bytes_hashed + stats.bytes_hashed
    context.log.info(
        f"verified {manifest.snapshot.version_id}: hashed {hashed} of {stats.bytes_total} bytes "
        f"({fetched.files_downloaded} files downloaded, {fetched.files_reused} reused from cache)"
    )
    return dg.Output(
        snapshot,
        metadata={
            **md.identity("snapshot", manifest.snapshot),
            **md.counts(manifest),
            "bundle_path": dg.MetadataValue.path(str(fetched.path)),
            "bytes_total": stats.bytes_total,
            "bytes_hashed": hashed,
            "fraction_hashed": round(hashed / max(stats.bytes_total, 1), 4),
            "bytes_downloaded": fetched.bytes_downloaded,
            "files_downloaded": fetched.files_downloaded,
            "files_reused_from_cache": fetched.files_reused,
        },
        data_version=dg.DataVersion(manifest.snapshot.content_sha256),
    )


@dg.asset_check(
    asset=verified_snapshot,
    blocking=True,
    description="The manifest binds every file and every bound file matches it (re-checked with "
    "the cache's trust: by the verification's receipt while every file keeps its fingerprint, "
    "else every rule, hashing only what the cache cannot vouch for).",
)
def manifest_binds_every_file(
    verified_snapshot: Path, bundle_store: BundleStoreResource
) -> dg.AssetCheckResult:
    """Verify the cached bundle view again, listing every violation found."""
    result = bundle_store.store().check(verified_snapshot)
    violations = [f"{type(e).__name__}: {e}" for e in result.errors]
    return dg.AssetCheckResult(
        passed=result.ok,
        metadata={
            "violations": len(result.errors),
            "details": "\n".join(violations) or "none",
            "bytes_hashed": result.stats.bytes_hashed if result.stats else 0,
        },
    )
