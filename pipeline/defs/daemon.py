"""The real ``dagster-daemon`` as a harness: start it, stop it with its children, wait for a chain.

The demo drives the PARTIAL loop through it; the recovery tests do the same and kill it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from pipeline.defs.jobs import CHAIN_JOB_NAME, CHAIN_RUN_RETRIES
from resources.compute.local import LocalCompute
from resources.settings import REPO_ROOT


def say(t0: float, msg: str) -> None:
    """Print ``msg`` with the seconds since ``t0``."""
    print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)


def start_daemon(env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start the real ``dagster-daemon`` (sensor, run queue) over ``workspace.yaml``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "dagster-daemon"
    cmd = [str(exe), "run", "-w", str(REPO_ROOT / "workspace.yaml")]
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed with it
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_daemon(proc: subprocess.Popen) -> None:
    """Stop the daemon and everything it started (its code server, run workers)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _final_failure(run: dg.DagsterRun) -> bool:
    """A chain run that failed and that the daemon will not retry again."""
    return (
        run.status == dg.DagsterRunStatus.FAILURE
        and run.job_name == CHAIN_JOB_NAME
        and int(run.tags.get("dagster/retry_number", "0")) >= CHAIN_RUN_RETRIES
    )


def wait_for_chain(
    instance: dg.DagsterInstance,
    compute: LocalCompute,
    job_id: str,
    *,
    daemon: subprocess.Popen,
    timeout: float,
    expect_complete: bool = True,
) -> dg.DagsterRun | None:
    """Poll until a chain run for the job's latest version succeeds; print what happens.

    A failed run the daemon will retry (run retries), or a failed resubmission the sensor will
    retry, is waited out; a chain run that failed its last retry is returned as it is.
    """
    t0 = time.monotonic()
    seen: dict[str, dg.DagsterRunStatus] = {}
    last_state = None
    while time.monotonic() - t0 < timeout:
        if daemon.poll() is not None:
            raise RuntimeError(f"dagster-daemon exited with {daemon.returncode}; see its log")
        try:
            status = compute.status(job_id)
        except Exception as e:  # a transient Compute error is shown, not fatal
            say(t0, f"Compute status unavailable: {e}")
            time.sleep(1)
            continue
        state = (status.state, status.attempt, status.latest_version_id)
        if state != last_state:
            last_state = state
            say(
                t0,
                f"Compute {job_id}: {status.state}, attempt {status.attempt}, "
                f"{status.outstanding} outstanding, latest version {status.latest_version_id}",
            )
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"lithi/job_id": job_id}))
        for run in sorted(runs, key=lambda r: r.run_id):
            if seen.get(run.run_id) != run.status:
                seen[run.run_id] = run.status
                say(
                    t0,
                    f"run {run.run_id[:8]} {run.job_name} for {run.tags.get('lithi/version_id')}: "
                    f"{run.status.value}",
                )
            if _final_failure(run):
                return run
        final = status.state == "SUCCEEDED" or not expect_complete
        for run in runs:
            if (
                final
                and run.job_name == CHAIN_JOB_NAME
                and run.tags.get("lithi/version_id") == status.latest_version_id
                and run.status == dg.DagsterRunStatus.SUCCESS
            ):
                return run
        time.sleep(1.0)
    raise TimeoutError(f"no finished chain run for {job_id} within {timeout:.0f}s")
