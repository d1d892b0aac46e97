"""What the sensor's page says, through the mutation its *Test sensor* button sends
(``sensorDryRun``): a version whose chain failed for good says so, instead of "complete and
already requested" and nothing more."""

from __future__ import annotations

import dagster as dg

from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.defs.sensor import SENSOR_NAME
from resources.compute.local import LocalCompute
from tests.helpers.graphql import graphql_on, launch, repository

DRY_RUN = """
mutation($selector: SensorSelector!, $cursor: String) {
  sensorDryRun(selectorData: $selector, cursor: $cursor) {
    __typename
    ... on DryRunInstigationTick {
      evaluationResult { runRequests { runKey } skipReason cursor error { message } }
    }
    ... on PythonError { message }
  }
}
"""

QUEUED = {"run_coordinator": {"module": "dagster", "class": "QueuedRunCoordinator"}}


def test_the_sensor_page_says_a_versions_chain_failed(tmp_path, monkeypatch, labelled_samples):
    job = labelled_samples.jobs["wine"]
    version = LocalCompute(labelled_samples.compute_root).status(job).latest_version_id
    monkeypatch.setenv("LITHI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LITHI_COMPUTE_ROOT", str(labelled_samples.compute_root))
    monkeypatch.setenv("LITHI_JOB_ID", job)
    with (
        dg.instance_for_test(overrides=QUEUED) as instance,
        graphql_on(instance, read_only=False, env_now=True) as query,
    ):
        selector = {**repository(query), "sensorName": SENSOR_NAME}

        def test_sensor(cursor: str | None) -> dict:
            answer = query(DRY_RUN, selector=selector, cursor=cursor)["sensorDryRun"]
            assert answer["__typename"] == "DryRunInstigationTick", answer
            result = answer["evaluationResult"]
            assert result["error"] is None, result["error"]
            return result

        first = test_sensor(None)
        assert [r["runKey"] for r in first["runRequests"]] == [f"chain:{job}:{version}"]
        # the run it asked for failed, and so did the daemon's two retries
        tags = {"lithi/job_id": job, "lithi/version_id": version, "lithi/trigger": "newer_manifest"}
        for _ in range(3):
            run = launch(query, CHAIN_JOB_NAME, tags=tags)
            assert run["__typename"] == "LaunchRunSuccess", run
            instance.report_run_failed(instance.get_run_by_id(run["run"]["runId"]))
        later = test_sensor(first["cursor"])
    assert later["runRequests"] == []
    reason = later["skipReason"]
    assert reason.startswith(f"{job}: version {version} is complete and already requested; ")
    assert "FAILED (3 run(s), retries included)" in reason
    assert "re-execute the failed run" in reason
