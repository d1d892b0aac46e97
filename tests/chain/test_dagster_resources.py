"""The Dagster resources: a job run through them inside Dagster."""

from __future__ import annotations

import dagster as dg

from pipeline.bundle.verify import verify
from pipeline.defs.samples import stage_sample
from resources.compute.client import JobSpec
from resources.dagster.clients import BundleStoreResource, ComputeResource


def test_a_job_runs_through_the_resources_in_dagster(tmp_path, monkeypatch):
    inp, ref = stage_sample("wine", tmp_path / "staged")
    monkeypatch.setenv("LITHI_TEST_COMPUTE_ROOT", str(tmp_path / "compute"))

    @dg.asset
    def labelled(
        compute: ComputeResource, bundle_store: BundleStoreResource
    ) -> dg.MaterializeResult:
        client = compute.client()
        job = client.submit(JobSpec(input_url=str(inp.root), reference_url=str(ref.root)))
        status = client.status(job)
        store = bundle_store.store()
        fetched = store.fetch(status.latest_manifest_url)
        snap = verify(fetched.path, trusted=store.trusted)
        return dg.MaterializeResult(
            metadata={"state": status.state, "items": snap.manifest.counts.items},
            data_version=dg.DataVersion(snap.identity.content_sha256),
        )

    result = dg.materialize(
        [labelled],
        resources={
            "compute": ComputeResource(
                root=dg.EnvVar("LITHI_TEST_COMPUTE_ROOT"), executor="inline"
            ),
            "bundle_store": BundleStoreResource(cache_dir=str(tmp_path / "cache")),
        },
    )
    assert result.success
    mat = result.asset_materializations_for_node("labelled")[0]
    assert mat.metadata["state"].value == "SUCCEEDED" and mat.metadata["items"].value == 178
    assert (tmp_path / "compute" / "jobs").is_dir() and (tmp_path / "cache" / "objects").is_dir()
