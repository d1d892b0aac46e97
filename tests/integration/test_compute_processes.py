"""The local Compute's subprocess executor: a job in a worker process of its own, a killed one."""

from __future__ import annotations

import os
import sys
import time

from pipeline.bundle.verify import verify
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.compute.local.jobstore import JobStore
from tests.helpers.timing import limit


def test_subprocess_executor_runs_the_job_in_another_process(tmp_path, digits):
    compute = LocalCompute(tmp_path, executor="subprocess")
    job = compute.submit(digits.spec(faults=FaultSpec(delay_seconds=0.5)))
    assert compute.status(job).state in ("QUEUED", "RUNNING")
    deadline = time.monotonic() + limit(180)
    while (st := compute.status(job)).state in ("QUEUED", "RUNNING"):
        assert st.running_attempt == 1
        assert time.monotonic() < deadline, f"job still {st.state}: {st.message}"
        time.sleep(0.05)
    assert st.state == "SUCCEEDED", st.message
    rec = JobStore(tmp_path).load(job)
    assert rec.attempts[0].pid not in (None, os.getpid())  # ran in a process of its own
    log = (tmp_path / "jobs" / job / "attempt-001.log").read_text()
    assert f"worker pid {rec.attempts[0].pid}" in log
    assert verify(st.latest_manifest_url).manifest.counts.items == 1797


def test_a_killed_worker_is_reported_failed(tmp_path, digits):
    compute = LocalCompute(tmp_path, executor="subprocess", python=sys.executable)
    job = compute.submit(digits.spec(faults=FaultSpec(delay_seconds=30)))
    deadline = time.monotonic() + limit(120)
    while (rec := JobStore(tmp_path).load(job)).current.state != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(rec.current.pid, 9)
    deadline = time.monotonic() + limit(60)
    while (st := compute.status(job)).state == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert st.state == "FAILED" and "exited without reporting" in st.message
