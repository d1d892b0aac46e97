"""A rebuild after a small resubmission hashes only the parts it has not verified before."""

import dagster as dg

from assets import result_manifest, verified_snapshot
from pipeline.bundle.verify import verify
from pipeline.defs.jobs import chain_run_config
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from tests.helpers.chain import chain_resources, sample_job


def _snapshot(tmp_path, job, version, instance) -> dict:
    result = dg.materialize(
        [result_manifest, verified_snapshot],
        resources=chain_resources(tmp_path, job),
        run_config=chain_run_config(job, version, allow_partial=True),
        instance=instance,
    )
    assert result.success
    meta = result.asset_materializations_for_node("verified_snapshot")[0].metadata
    return {k: v.value for k, v in meta.items()}


def test_rebuild_after_resubmitting_5_percent_hashes_only_the_new_parts(tmp_path):
    job = sample_job(tmp_path, "digits", FaultSpec(lose_fraction=0.05))
    compute = LocalCompute(tmp_path / "compute", "inline")
    v1 = compute.status(job).latest_version_id
    compute.resubmit(job, from_version_id=v1, idempotency_key="k")
    v2 = compute.status(job).latest_version_id
    old = {p.sha256 for p in verify(compute.manifest_url(job, v1)).manifest.parts}
    new_parts = [p for p in verify(compute.manifest_url(job, v2)).manifest.parts
                 if p.sha256 not in old]  # fmt: skip
    assert new_parts  # the resubmitted items landed in parts of their own

    with dg.instance_for_test() as instance:
        first = _snapshot(tmp_path, job, v1, instance)
        second = _snapshot(tmp_path, job, v2, instance)
    assert first["bytes_hashed"] == first["bytes_total"]  # nothing was cached yet
    assert second["bytes_hashed"] == sum(p.bytes for p in new_parts)
    assert second["files_downloaded"] == len(new_parts)
    print(f"rebuild hashed {second['fraction_hashed']:.1%} of {second['bytes_total']} bytes")
    assert second["fraction_hashed"] < 0.15
