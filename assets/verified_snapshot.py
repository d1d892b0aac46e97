"""``verified_snapshot``: the bundle fetched once into the cache, verified against its manifest."""

import dagster as dg

from assets import metadata as md
from assets.refs import ManifestRef, SnapshotRef
from pipeline.jobs import CHAIN_GROUP
from pipeline.verify import check
from resources.dagster_resources import BundleStoreResource

BINDS_EVERY_FILE = "manifest_binds_every_file"


@dg.asset(
    group_name=CHAIN_GROUP,
    kinds={"python", "parquet"},
    code_version="1",
    description="The result bundle, downloaded once into the content-addressed cache and verified:"
    " every bound file's bytes, sha256, rows and schema; no unbound file; ids unique strings. Its "
    "data version is the content digest, so a new bundle marks everything downstream stale.",
    check_specs=[
        dg.AssetCheckSpec(
            BINDS_EVERY_FILE,
            asset="verified_snapshot",
            blocking=True,
            description="The manifest binds every file and every bound file matches it.",
        )
    ],
)
def verified_snapshot(
    context: dg.AssetExecutionContext,
    result_manifest: ManifestRef,
    bundle_store: BundleStoreResource,
):
    """Fetch (only what the cache lacks) and verify; a violation fails the blocking check."""
    store = bundle_store.store()
    fetched = store.fetch(result_manifest.url, credential_ref=result_manifest.credential_ref)
    manifest, errors, stats = check(fetched.path, trusted=store.trusted)
    violations = [f"{type(e).__name__}: {e}" for e in errors]
    yield dg.AssetCheckResult(
        check_name=BINDS_EVERY_FILE,
        passed=not errors,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"violations": len(errors), "details": "\n".join(violations) or "none"},
    )
    if errors:
        raise dg.Failure(f"bundle {fetched.path} does not verify:\n" + "\n".join(violations))
    assert manifest is not None and stats is not None
    if manifest.snapshot != result_manifest.manifest.snapshot:
        raise dg.Failure(
            f"the fetched bundle is {manifest.snapshot}, but result_manifest read "
            f"{result_manifest.manifest.snapshot}"
        )
    context.log.info(
        f"verified {manifest.snapshot.version_id}: hashed {stats.bytes_hashed} of "
        f"{stats.bytes_total} bytes ({stats.files_hashed}/{stats.files_total} files new)"
    )
    yield dg.Output(
        SnapshotRef(
            path=str(fetched.path),
            identity=manifest.snapshot,
            credential_ref=result_manifest.credential_ref,
        ),
        metadata={
            **md.identity("snapshot", manifest.snapshot),
            **md.counts(manifest),
            "bundle_path": dg.MetadataValue.path(str(fetched.path)),
            "bytes_total": stats.bytes_total,
            "bytes_hashed": stats.bytes_hashed,
            "files_hashed": stats.files_hashed,
            "bytes_downloaded": fetched.bytes_downloaded,
            "files_reused_from_cache": fetched.files_reused,
        },
        data_version=dg.DataVersion(manifest.snapshot.content_sha256),
    )
