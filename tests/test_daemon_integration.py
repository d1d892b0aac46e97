"""The real ``dagster-daemon`` carries a PARTIAL job to a complete bundle and a rebuilt chain.

Nothing is driven by hand: the test submits a job that loses 30% of its items, starts the
daemon on a temporary SQLite instance, and waits while the real sensor requests the
resubmission, the local Compute publishes the newer manifest, and the chain rebuilds from it.
"""

import os
import shutil

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.bundle.verify import verify
from pipeline.defs import samples
from pipeline.defs.demo import (
    start_daemon,
    stop_daemon,
    submit_sample_job,
    summarize,
    wait_for_chain,
)
from pipeline.defs.jobs import CHAIN_JOB_NAME
from resources.compute.faults import FaultSpec
from resources.settings import REPO_ROOT


@pytest.mark.integration
def test_daemon_resubmits_partial_job_and_rebuilds_chain(tmp_path, monkeypatch):
    dagster_home, home = tmp_path / "dagster_home", tmp_path / "lithi"
    dagster_home.mkdir()
    shutil.copy(REPO_ROOT / "dagster_home" / "dagster.yaml", dagster_home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    monkeypatch.setenv("LITHI_HOME", str(home))
    job_id, compute = submit_sample_job("wine", home, FaultSpec(lose_fraction=0.3))
    compute.wait(job_id, timeout=60)
    first = compute.status(job_id)
    assert first.state == "PARTIAL" and first.outstanding > 0
    env = {
        **os.environ,
        "LITHI_JOB_ID": job_id,
        "LITHI_RESUBMIT_DELAY_SECONDS": "0",
        "LITHI_WORLD_SIZE": "1",
        "LITHI_NUM_WORKERS": "0",
    }
    with dg.DagsterInstance.get() as instance:
        daemon = start_daemon(env, home / "daemon.log")
        try:
            run = wait_for_chain(instance, compute, job_id, daemon=daemon, timeout=240)
            summary = summarize(instance, compute, job_id, run)
        finally:
            stop_daemon(daemon)
        assert run.status == dg.DagsterRunStatus.SUCCESS, (home / "daemon.log").read_text()[-3000:]
        chain_runs = instance.get_runs(filters=dg.RunsFilter(job_name=CHAIN_JOB_NAME))

    final = compute.status(job_id)
    assert final.state == "SUCCEEDED" and len(final.versions) >= 2
    # Exactly one chain run, for the newest manifest, tagged with the version that triggered it.
    assert [r.tags["lithi/version_id"] for r in chain_runs] == [final.latest_version_id]
    assert summary["trained_on"] == final.latest_version_id
    assert summary["resubmitted_versions"] == [first.latest_version_id]

    # The complete bundle verifies, and every submitted item appears in it exactly once.
    newest = verify(compute.manifest_url(job_id))
    ids = pa.concat_arrays(
        [pq.read_table(p, columns=[newest.manifest.item_id_field]).column(0).combine_chunks()
         for p in newest.part_paths()]
    )  # fmt: skip
    submitted = samples.load("wine").input.column(newest.manifest.item_id_field)
    assert len(ids) == len(submitted) == pc.count_distinct(ids).as_py()
    assert set(ids.to_pylist()) == set(submitted.to_pylist())
    assert newest.manifest.job.parent_version_id == first.latest_version_id

    # The earlier PARTIAL version is intact and still verifies.
    assert verify(compute.manifest_url(job_id, first.latest_version_id)).manifest.is_partial

    # The reconciliation accounts for every submitted item.
    rec = summary["reconciliation"]
    assert rec["ok"] is True
    found = rec["by_status_found"]
    assert found["accepted"] + found["failed"] + found["abstained"] == len(submitted)
    assert rec["outstanding"] == 0
