"""The resubmission job: a transient Compute error is retried by Dagster, never doubled."""

import dagster as dg

from pipeline.jobs import resubmit_job, resubmit_run_config
from resources.compute.client import ComputeUnavailable
from resources.compute.faults import FaultSpec
from resources.compute.jobstore import JobStore
from resources.compute.local import LocalCompute
from resources.dagster_resources import BundleStoreResource, ComputeResource
from tests.chain_fixtures import sample_job

FLAKY_CALLS: list[str] = []


class FlakyCompute(LocalCompute):
    """Times out on the first resubmission call, after the request reached Compute."""

    def resubmit(self, job_id, *, from_version_id, idempotency_key):
        attempt = super().resubmit(
            job_id, from_version_id=from_version_id, idempotency_key=idempotency_key
        )
        FLAKY_CALLS.append(idempotency_key)
        if len(FLAKY_CALLS) == 1:
            raise ComputeUnavailable("timed out waiting for the answer")
        return attempt


class FlakyComputeResource(ComputeResource):
    def client(self) -> LocalCompute:
        return FlakyCompute(self.root, "inline")


def test_transient_error_is_retried_and_resubmits_once(tmp_path, monkeypatch):
    monkeypatch.setattr("pipeline.jobs.RETRY_BASE_SECONDS", 0.0)
    job = sample_job(tmp_path, "wine", FaultSpec(lose_fraction=0.3))
    compute = LocalCompute(tmp_path / "compute", "inline")
    v1 = compute.status(job).latest_version_id
    FLAKY_CALLS.clear()
    with dg.instance_for_test() as instance:
        result = resubmit_job.execute_in_process(
            run_config=resubmit_run_config(job, v1),
            resources={
                "compute": FlakyComputeResource(root=str(tmp_path / "compute")),
                "bundle_store": BundleStoreResource(cache_dir=str(tmp_path / "cache")),
            },
            instance=instance,
        )
        retried = [
            e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
        ]
    assert result.success
    assert len(retried) == 1  # Dagster retried the op once
    assert len(FLAKY_CALLS) == 2 and len(set(FLAKY_CALLS)) == 1  # same idempotency key
    assert [a.number for a in JobStore(tmp_path / "compute").load(job).attempts] == [1, 2]
    status = compute.status(job)
    assert status.state == "SUCCEEDED" and status.versions[0] == v1
    assert result.output_for_node("resubmit_outstanding") == 2
