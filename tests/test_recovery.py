"""Recovery without a person, with the real daemon: a killed daemon and a failed chain run.

The instance is the project's ``dagster.yaml`` (run monitoring and run retries on) with run
monitoring's timeouts shortened so a test waits seconds, not minutes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pipeline.defs.daemon import start_daemon, stop_daemon, wait_for_chain
from pipeline.defs.instance import PROJECT_YAML, prepare_instance
from pipeline.defs.jobs import CHAIN_JOB_NAME, RESUBMIT_JOB_NAME
from pipeline.defs.samples import submit_sample_job
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.compute.local.jobstore import JobStore

pytestmark = pytest.mark.integration


@pytest.fixture
def homes(tmp_path: Path) -> tuple[Path, Path]:
    """A Dagster home with the project's settings (monitoring polled every 2 s, a run that has
    not started after 15 s failed) and a LITHI_HOME."""
    config = yaml.safe_load(PROJECT_YAML.read_text())
    config["run_monitoring"].update(poll_interval_seconds=2, start_timeout_seconds=15)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config))
    prepare_instance(dagster_home)
    return dagster_home, tmp_path / "lithi"


def _env(dagster_home: Path, home: Path, job_id: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITHI_")}
    return env | {
        "DAGSTER_HOME": str(dagster_home),
        "LITHI_HOME": str(home),
        "LITHI_JOB_ID": job_id,
        "LITHI_RESUBMIT_DELAY_SECONDS": "0",
        "LITHI_WORLD_SIZE": "1",
        "LITHI_NUM_WORKERS": "0",
        "LITHI_TRAINER_CONFIG": '{"auto_features": true, "epochs": 2}',
        **extra,
    }


def _runs(instance: dg.DagsterInstance, job_name: str) -> list[dg.DagsterRun]:
    """The job's runs, oldest first (the instance lists the newest first)."""
    return list(reversed(instance.get_runs(filters=dg.RunsFilter(job_name=job_name))))


def test_a_daemon_killed_while_the_resubmission_starts_recovers_by_itself(homes):
    dagster_home, home = homes
    job, compute = submit_sample_job("wine", home, FaultSpec(lose_fraction=0.3))
    compute.wait(job, timeout=120)
    assert compute.status(job).state == "PARTIAL"
    env = _env(dagster_home, home, job)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        daemon = start_daemon(env, home / "daemon-1.log")
        caught = None
        deadline = time.monotonic() + 120
        try:
            while caught is None and time.monotonic() < deadline:
                for run in _runs(instance, RESUBMIT_JOB_NAME):
                    if run.status == dg.DagsterRunStatus.STARTING:
                        os.killpg(daemon.pid, signal.SIGKILL)  # the daemon and all it started
                        caught = run.run_id
                        break
                time.sleep(0.01)
        finally:
            if caught is None:
                stop_daemon(daemon)
        assert caught, "never saw the resubmission run STARTING within 120 s"
        daemon.wait(timeout=30)
        time.sleep(3)
        stuck = instance.get_run_by_id(caught)
        assert stuck.status == dg.DagsterRunStatus.STARTING  # nobody left to move it on
        assert [a.number for a in JobStore(home / "compute").load(job).attempts] == [1]

        daemon = start_daemon(env, home / "daemon-2.log")
        try:
            run = wait_for_chain(instance, compute, job, daemon=daemon, timeout=240)
        finally:
            stop_daemon(daemon)
        assert run.status == dg.DagsterRunStatus.SUCCESS
        resubmits = _runs(instance, RESUBMIT_JOB_NAME)
        chains = _runs(instance, CHAIN_JOB_NAME)
    # Run monitoring failed the stuck run; the sensor resubmitted again under a new run key
    # with the same idempotency key: Compute ran the outstanding items exactly once.
    assert [r.status for r in resubmits] == [
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.SUCCESS,
    ]
    assert resubmits[0].run_id == caught and resubmits[1].tags["lithi/retry"] == "1"
    assert [a.number for a in JobStore(home / "compute").load(job).attempts] == [1, 2]
    assert [(r.status, r.tags["lithi/version_id"]) for r in chains] == [
        (dg.DagsterRunStatus.SUCCESS, LocalCompute(home / "compute").status(job).latest_version_id)
    ]


def test_a_failed_chain_run_is_retried_by_the_daemon(homes, tmp_path):
    dagster_home, home = homes
    job, compute = submit_sample_job("wine", home, FaultSpec())
    compute.wait(job, timeout=120)
    marker = tmp_path / "failed-once"
    env = _env(
        dagster_home,
        home,
        job,
        LITHI_TRAINER="tests.helpers.flaky_trainer:FailsOnce",
        FLAKY_TRAINER_MARKER=str(marker),
    )
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        daemon = start_daemon(env, home / "daemon.log")
        try:
            run = wait_for_chain(instance, compute, job, daemon=daemon, timeout=240)
        finally:
            stop_daemon(daemon)
        chains = _runs(instance, CHAIN_JOB_NAME)
    assert marker.exists()  # the first run did fail in training
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert [r.status for r in chains] == [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.SUCCESS]
    retry = chains[1]
    assert retry.tags["dagster/parent_run_id"] == chains[0].run_id
    assert retry.tags["lithi/version_id"] == chains[0].tags["lithi/version_id"]
