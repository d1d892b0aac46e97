"""The resubmission job: a transient Compute error is retried by Dagster, never doubled."""

import dagster as dg

from pipeline.defs.jobs import resubmit_job, resubmit_run_config
from pipeline.defs.sensor import tick as sensor_tick
from resources.compute.client import ComputeError, ComputeUnavailable
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.compute.local.jobstore import JobStore
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource
from tests.helpers.chain import chain_resources, sample_job
from tests.helpers.dagster_internals import RUN_KEY_TAG

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


class DownCompute(LocalCompute):
    """Refuses every resubmission, as a Compute outage longer than the op's retries would."""

    def resubmit(self, job_id, *, from_version_id, idempotency_key):
        raise ComputeError("Compute is down for maintenance")


class BrokenComputeResource(ComputeResource):
    """The local Compute under ``root``, resubmitting as ``broken`` names (flaky or down)."""

    broken: str

    def client(self) -> LocalCompute:
        return {"flaky": FlakyCompute, "down": DownCompute}[self.broken](self.root, "inline")


def _partial_wine(home) -> tuple[str, LocalCompute, str]:
    """The wine sample labelled by an inline Compute under ``home``, 30% of its items lost: the
    job, that Compute, and the PARTIAL version."""
    job = sample_job(home, "wine", FaultSpec(lose_fraction=0.3))
    compute = LocalCompute(home / "compute", "inline")
    return job, compute, compute.status(job).latest_version_id


def test_transient_error_is_retried_and_resubmits_once(tmp_path):
    job, compute, v1 = _partial_wine(tmp_path)
    FLAKY_CALLS.clear()
    with dg.instance_for_test() as instance:
        result = resubmit_job.execute_in_process(
            run_config=resubmit_run_config(job, v1),
            resources={
                "compute": BrokenComputeResource(root=str(tmp_path / "compute"), broken="flaky"),
                "bundle_store": BundleStoreResource(cache_dir=str(tmp_path / "cache")),
                "chain_settings": ChainSettings(),
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


def test_a_failed_resubmission_run_is_retried_by_the_sensor(tmp_path):
    job, compute, v1 = _partial_wine(tmp_path)
    healthy = chain_resources(tmp_path, job, base_delay_seconds=0)
    down = {
        **healthy,
        "compute": BrokenComputeResource(root=str(tmp_path / "compute"), broken="down"),
    }

    def tick(instance, resources, cursor):
        with dg.build_sensor_context(instance=instance, cursor=cursor) as context:
            return sensor_tick(
                context,
                resources["compute"],
                resources["chain_settings"],
                resources["bundle_store"],
                now=1.0,
            )

    def launch(instance, resources, request):
        tags = {**request.tags, RUN_KEY_TAG: request.run_key}
        return resubmit_job.execute_in_process(
            run_config=request.run_config,
            resources={k: resources[k] for k in ("compute", "bundle_store", "chain_settings")},
            instance=instance,
            tags=tags,
            raise_on_error=False,
        )

    with dg.instance_for_test() as instance:
        first = tick(instance, healthy, None)
        (request,) = first.run_requests
        assert not launch(instance, down, request).success  # the outage outlasts the op
        second = tick(instance, healthy, first.cursor)
        (retry,) = second.run_requests
        assert retry.run_key == f"resubmit:{job}:{v1}:retry1"
        assert tick(instance, healthy, second.cursor).run_requests == []  # not yet failed
        assert launch(instance, healthy, retry).success
        third = tick(instance, healthy, second.cursor)
    (chain,) = third.run_requests
    status = compute.status(job)
    assert (
        status.state == "SUCCEEDED" and chain.run_key == f"chain:{job}:{status.latest_version_id}"
    )
    assert [a.number for a in JobStore(tmp_path / "compute").load(job).attempts] == [1, 2]


def test_a_canceled_resubmission_run_is_retried_too(tmp_path):
    """An operator's cancel (or run monitoring's, for a run that never started) resubmitted
    nothing for sure: the sensor asks again, under a new run key, with the same idempotency key."""
    job = sample_job(tmp_path, "wine", FaultSpec(lose_fraction=0.3))
    resources = chain_resources(tmp_path, job, base_delay_seconds=0)
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(instance=instance) as context:
            first = sensor_tick(
                context, resources["compute"], resources["chain_settings"],
                resources["bundle_store"], now=1.0,
            )  # fmt: skip
        (request,) = first.run_requests
        run = instance.create_run_for_job(
            resubmit_job,
            run_config=request.run_config,
            tags={**request.tags, RUN_KEY_TAG: request.run_key},
        )
        instance.report_run_canceled(run)
        with dg.build_sensor_context(instance=instance, cursor=first.cursor) as context:
            second = sensor_tick(
                context, resources["compute"], resources["chain_settings"],
                resources["bundle_store"], now=2.0,
            )  # fmt: skip
    (retry,) = second.run_requests
    assert retry.run_key == f"{request.run_key}:retry1"
    assert retry.run_config == request.run_config  # same version, same idempotency key
