"""Recovery without a person, with the real daemon: a killed daemon and a failed chain run.

The instance is the project's ``dagster.yaml`` (run monitoring and run retries on). Only the test
about run monitoring shortens its start timeout, and then to what this machine needs at the
moment (``_start_timeout``): every run the daemon launches there must start within it, and on a
loaded 2-core machine loading the code location alone can take tens of seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import yaml

from pipeline.defs.daemon import start_daemon, stop_daemon, wait_for_chain
from pipeline.defs.instance import PROJECT_YAML, prepare_instance
from pipeline.defs.jobs import CHAIN_JOB_NAME, RESUBMIT_JOB_NAME
from pipeline.defs.samples import submit_sample_job
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.compute.local.jobstore import JobStore
from resources.settings import REPO_ROOT
from tests.helpers.timing import limit, wait_until


def _homes(tmp_path: Path, **run_monitoring: float) -> tuple[Path, Path]:
    """A Dagster home with the project's settings (``run_monitoring`` overriding its own) and a
    LITHI_HOME."""
    config = yaml.safe_load(PROJECT_YAML.read_text())
    config["run_monitoring"].update(run_monitoring)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config))
    prepare_instance(dagster_home)
    return dagster_home, tmp_path / "lithi"


def _start_timeout(tmp_path: Path) -> int:
    """Run monitoring's start timeout for the test about it: short enough to wait out, long
    enough for every run it launches to start. Derived from how long loading the code location
    takes here and now (most of what a run does before it counts as started): four times that,
    at least 30 s, times the run's factor."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITHI_")}
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import pipeline.defs.definitions"],
        cwd=REPO_ROOT,
        env=env | {"LITHI_HOME": str(tmp_path / "probe")},
        capture_output=True,
        check=True,
        timeout=limit(300),
    )
    return int(limit(max(30.0, 4 * (time.monotonic() - t0))))


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


def _group_alive(pgid: int) -> bool:
    """Whether a process of the process group ``pgid`` still runs (a zombie runs nothing)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except OSError:  # gone meanwhile
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _runs(instance: dg.DagsterInstance, job_name: str) -> list[dg.DagsterRun]:
    """The job's runs, oldest first (the instance lists the newest first)."""
    return list(reversed(instance.get_runs(filters=dg.RunsFilter(job_name=job_name))))


def test_a_daemon_killed_while_the_resubmission_starts_recovers_by_itself(tmp_path):
    start_timeout = _start_timeout(tmp_path)
    dagster_home, home = _homes(
        tmp_path, poll_interval_seconds=2, start_timeout_seconds=start_timeout
    )
    job, compute = submit_sample_job("wine", home, FaultSpec(lose_fraction=0.3))
    compute.wait(job, timeout=limit(120))
    assert compute.status(job).state == "PARTIAL"
    env = _env(dagster_home, home, job)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        daemon = start_daemon(env, home / "daemon-1.log")
        caught = None
        deadline = time.monotonic() + limit(240)
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
        assert caught, "never saw the resubmission run STARTING"
        daemon.wait(timeout=limit(30))
        wait_until(
            lambda: not _group_alive(daemon.pid),
            timeout=limit(30),
            what="every process the daemon started gone",
        )
        stuck = instance.get_run_by_id(caught)
        assert stuck.status == dg.DagsterRunStatus.STARTING  # nobody left to move it on
        assert [a.number for a in JobStore(home / "compute").load(job).attempts] == [1]

        daemon = start_daemon(env, home / "daemon-2.log")
        try:
            # the stuck run waits out its start timeout; then a resubmission and a chain run
            run = wait_for_chain(
                instance, compute, job, daemon=daemon, timeout=start_timeout + limit(300)
            )
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


def test_a_failed_chain_run_is_retried_by_the_daemon(tmp_path):
    dagster_home, home = _homes(tmp_path)  # the product's run monitoring, unchanged
    job, compute = submit_sample_job("wine", home, FaultSpec())
    compute.wait(job, timeout=limit(120))
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
            run = wait_for_chain(instance, compute, job, daemon=daemon, timeout=limit(420))
        finally:
            stop_daemon(daemon)
        chains = _runs(instance, CHAIN_JOB_NAME)
    assert marker.exists()  # the first run did fail in training
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert [r.status for r in chains] == [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.SUCCESS]
    retry = chains[1]
    assert retry.tags["dagster/parent_run_id"] == chains[0].run_id
    assert retry.tags["lithi/version_id"] == chains[0].tags["lithi/version_id"]
