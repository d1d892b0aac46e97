"""The Dagster resources: embedded defaults, env overrides, and a job run through them."""

from __future__ import annotations

import dagster as dg

from pipeline.bundle.verify import verify
from pipeline.defs.samples import stage_sample
from resources.compute.client import JobSpec
from resources.dagster_resources import (
    BundleStoreResource,
    ComputeResource,
    default_resources,
    parse_credential_refs,
)


def test_defaults_come_from_the_environment_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv("LITHI_HOME", str(tmp_path / "home"))
    for name in ("LITHI_COMPUTE_ROOT", "LITHI_CACHE_DIR", "LITHI_COMPUTE_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LITHI_CREDENTIAL_REFS", "lab=LAB_TOKEN, other=OTHER_TOKEN")
    res = default_resources()
    assert set(res) == {"compute", "bundle_store"}
    assert res["compute"].root == str(tmp_path / "home" / "compute")
    assert res["bundle_store"].store().cache_dir == tmp_path / "home" / "cache"
    assert res["bundle_store"].credential_refs == {"lab": "LAB_TOKEN", "other": "OTHER_TOKEN"}
    monkeypatch.setenv("LITHI_COMPUTE_ROOT", str(tmp_path / "elsewhere"))
    assert isinstance(default_resources()["compute"].root, dg.EnvVar)
    assert parse_credential_refs("") == {}


def test_a_job_runs_through_the_resources_in_dagster(tmp_path, monkeypatch):
    inp, ref = stage_sample("wine", tmp_path / "staged")
    monkeypatch.setenv("LITHI_COMPUTE_ROOT", str(tmp_path / "compute"))

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
            "compute": ComputeResource(root=dg.EnvVar("LITHI_COMPUTE_ROOT"), executor="inline"),
            "bundle_store": BundleStoreResource(cache_dir=str(tmp_path / "cache")),
        },
    )
    assert result.success
    mat = result.asset_materializations_for_node("labelled")[0]
    assert mat.metadata["state"].value == "SUCCEEDED" and mat.metadata["items"].value == 178
    assert (tmp_path / "compute" / "jobs").is_dir() and (tmp_path / "cache" / "objects").is_dir()
