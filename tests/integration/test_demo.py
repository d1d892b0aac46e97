"""The README's main command, as a subprocess: PARTIAL first, real daemon + sensor, summary, exit 0.

Run twice: on the project's SQLite instance, and on a PostgreSQL-backed one (deploy/dagster.yaml,
a fresh database on the server LITHI_TEST_POSTGRES_URL names; skipped, loudly, without one).

Nothing is driven by hand: the demo submits a job that loses 30% of its items, starts the real
``dagster-daemon`` on a temporary SQLite instance, and waits while the sensor requests the
resubmission, the local Compute publishes the newer manifest, and the chain rebuilds from it
with two torchrun ranks. The test then reads the instance and the bundles the run left behind.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.bundle.verify import verify
from pipeline.defs import samples
from pipeline.defs.instance import PROJECT_YAML
from pipeline.defs.jobs import CHAIN_JOB_NAME, RESUBMIT_JOB_NAME
from resources.compute.local import LocalCompute
from resources.settings import REPO_ROOT
from tests.helpers.postgres import fresh_database, postgres_home
from tests.helpers.timing import limit


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request, tmp_path, monkeypatch) -> Iterator[dict[str, str]]:
    """The demo's instance: the project's SQLite one, or the deploy/ Postgres one."""
    dagster_home = tmp_path / "dagster_home"
    if request.param == "sqlite":
        dagster_home.mkdir()
        shutil.copy(PROJECT_YAML, dagster_home / "dagster.yaml")
        yield {"DAGSTER_HOME": str(dagster_home)}
        return
    with fresh_database() as url:
        env = postgres_home(dagster_home, url)
        # This process opens the instance too (to read the runs back).
        monkeypatch.setenv("DAGSTER_POSTGRES_URL", env["DAGSTER_POSTGRES_URL"])
        yield env


@pytest.mark.timeout(900)
def test_demo_ends_with_a_reconciled_summary_and_exit_0(tmp_path, storage):
    dagster_home, home = Path(storage["DAGSTER_HOME"]), tmp_path / "lithi"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LITHI_")},
        **storage,
        "LITHI_HOME": str(home),
        "LITHI_NUM_WORKERS": "0",
    }
    # The demo's own limit on waiting for the chain comes first, so a slow run ends with its
    # account of what happened, not with a kill; both below the test's own limit.
    wait = limit(720)
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.defs.demo", "--sample", "wine", "--world-size", "2",
         "--timeout", str(wait)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=wait + limit(120),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "PARTIAL" in text and "SUCCEEDED attempt 2" in text
    assert "resubmitted outstanding items of: wine-" in text
    assert "reconciled: True  iterated 178 of 178" in text
    assert "output bundle: prediction-" in text
    assert "accuracy vs true labels" in text

    # The chain it trained is declared where `make ui` reads it, not only in its daemon's env
    declared = yaml.safe_load((home / "chains.yaml").read_text())
    assert declared["default_chain"]["config"] == {"features": samples.sample_features("wine")}

    (summary_file,) = (home / "logs").glob("summary-*.json")
    summary = json.loads(summary_file.read_text())
    job_id = summary["job_id"]
    compute = LocalCompute(home / "compute")
    final = compute.status(job_id)
    first, newest_version = final.versions[0], final.latest_version_id
    assert final.state == "SUCCEEDED" and len(final.versions) >= 2

    # One resubmission of the PARTIAL version, then one chain run, for the newest manifest.
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        chain_runs = instance.get_runs(filters=dg.RunsFilter(job_name=CHAIN_JOB_NAME))
        resubmits = instance.get_runs(filters=dg.RunsFilter(job_name=RESUBMIT_JOB_NAME))
    assert [r.tags["lithi/version_id"] for r in chain_runs] == [newest_version]
    assert [r.tags["lithi/version_id"] for r in resubmits] == [first]
    assert summary["trained_on"] == newest_version
    assert summary["resubmitted_versions"] == [first]

    # The complete bundle verifies, and every submitted item appears in it exactly once.
    newest = verify(compute.manifest_url(job_id))
    id_field = newest.manifest.item_id_field
    ids = pa.concat_arrays(
        [pq.read_table(p, columns=[id_field]).column(0).combine_chunks()
         for p in newest.part_paths()]
    )  # fmt: skip
    submitted = samples.load("wine").input.column(id_field)
    assert len(ids) == len(submitted) == pc.count_distinct(ids).as_py()
    assert set(ids.to_pylist()) == set(submitted.to_pylist())
    assert newest.manifest.job.parent_version_id == first

    # The earlier PARTIAL version is intact and still verifies.
    assert verify(compute.manifest_url(job_id, first)).manifest.is_partial

    # The reconciliation accounts for every submitted item, failures and abstentions included.
    rec = summary["reconciliation"]
    assert rec["ok"] is True
    found = rec["by_status_found"]
    assert found["failed"] > 0  # the demo makes 2% of items fail: they are counted, not dropped
    assert found["accepted"] + found["failed"] + found["abstained"] == len(submitted)
    assert rec["outstanding"] == 0
    # The digests the summary prints are the digests, not their UI formatting.
    assert re.fullmatch(r"[0-9a-f]{64}", summary["checkpoint_sha256"])
    output = summary["output_bundle"]
    assert summary["output_content_sha256"] == output["content_sha256"]
    assert verify(output["path"]).identity.content_sha256 == output["content_sha256"]
    assert f"checkpoint sha256: {summary['checkpoint_sha256']}\n" in text
