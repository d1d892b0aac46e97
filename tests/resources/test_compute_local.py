"""The local Compute, run for real: labelled results, PARTIAL jobs, resubmission, faults, state."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.verify import verify
from pipeline.defs.samples import load
from resources.compute.client import (
    ComputeError,
    ComputeUnavailable,
    InvalidJobId,
    InvalidResubmission,
    UnknownJob,
)
from resources.compute.faults import FaultSpec, lost_items
from resources.compute.local import LocalCompute
from resources.compute.local.worker import main as worker_main
from resources.compute.local.worker import results_dir, run_attempt


def _ids(snapshot) -> list[str]:
    idf = snapshot.manifest.item_id_field
    return [
        i for p in snapshot.part_paths() for i in pq.read_table(p, columns=[idf])[idf].to_pylist()
    ]


def _table(snapshot) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in snapshot.part_paths())


def test_submit_labels_every_item_for_real(tmp_path, digits):
    inp, ref = digits
    compute = LocalCompute(tmp_path / "compute", executor="inline")
    job = compute.submit(digits.spec())
    st = compute.status(job)
    assert st.state == "SUCCEEDED" and st.attempt == 1 and st.running_attempt is None
    assert st.versions == [st.latest_version_id] and st.outstanding == 0

    result = verify(compute.manifest_url(job))
    m = result.manifest
    assert m.kind == "result" and m.job.status == "SUCCEEDED" and m.job.attempt == 1
    assert m.input.snapshot == inp.identity
    assert m.item_id_field == "image_id"
    assert m.schema_.names == ["image_id", "pixels", *fmt.RESULT_COLUMNS, "lithi_label"]
    assert len(m.parts) == 6  # 1,797 rows in parts of 300
    c = m.counts
    assert c.items == 1797 and c.accepted + c.abstained + c.failed == 1797 and c.outstanding == 0
    assert sorted(_ids(result)) == sorted(_ids(inp))

    table = _table(result)
    truth = dict(zip(*load("digits").truth.to_pydict().values(), strict=True))
    reference_ids = set(_ids(ref))
    accepted = table.filter(pc.equal(table["lithi_status"], "accepted"))
    held_out = [
        (i, label)
        for i, label in zip(
            accepted["image_id"].to_pylist(), accepted["lithi_label"].to_pylist(), strict=True
        )
        if i not in reference_ids
    ]
    accuracy = np.mean([truth[i] == label for i, label in held_out])
    assert len(held_out) > 1000 and accuracy > 0.9  # a random labeller would score ~0.1
    abstained = table.filter(pc.equal(table["lithi_status"], "abstained"))
    assert abstained["lithi_label"].null_count == abstained.num_rows
    assert pc.max(abstained["lithi_confidence"]).as_py() < 0.3  # below the margin threshold
    assert pc.min(accepted["lithi_confidence"]).as_py() >= 0.3
    assert set(table["lithi_verification"].to_pylist()) <= {"agree", "disagree"}


def test_submit_is_idempotent_per_key_and_per_job_id(tmp_path, digits):
    compute = LocalCompute(tmp_path, executor="inline")
    a = compute.submit(digits.spec(idempotency_key="once"))
    b = compute.submit(digits.spec(idempotency_key="once"))
    assert a == b and compute.list_jobs() == [a]
    assert compute.status(a).versions == compute.status(b).versions  # one run, one version
    c = compute.submit(digits.spec(job_id="named"))
    assert compute.submit(digits.spec(job_id="named")) == c == "named"
    assert compute.list_jobs() == sorted([a, "named"])
    with pytest.raises(ComputeError, match="different spec"):
        compute.submit(digits.spec(job_id="named", k=3))


def test_partial_then_resubmit_publishes_a_newer_version_reusing_parts(tmp_path, digits):
    inp, _ = digits
    compute = LocalCompute(tmp_path, executor="inline")
    job = compute.submit(digits.spec(faults=FaultSpec(lose_fraction=0.3)))
    st = compute.status(job)
    assert st.state == "PARTIAL" and st.outstanding == 540  # ceil(0.3 * 1797)
    first = verify(compute.manifest_url(job))
    assert first.manifest.job.next_action.items == 540
    outstanding = pq.read_table(first.root / fmt.OUTSTANDING_NAME)["image_id"].to_pylist()
    assert set(outstanding) == lost_items(_ids(inp), 0.3, 1)
    assert not set(outstanding) & set(_ids(first))

    attempt = compute.resubmit(job, from_version_id=st.latest_version_id, idempotency_key="r1")
    st2 = compute.status(job)
    assert attempt == 2 and st2.attempt == 2 and st2.state == "SUCCEEDED"
    assert st2.versions == [st.latest_version_id, st2.latest_version_id]
    second = verify(compute.manifest_url(job))
    assert second.manifest.job.parent_version_id == st.latest_version_id
    assert second.manifest.job.attempt == 2 and second.manifest.outstanding is None
    # the first version's parts are bound again as hard links: same inode, not copied
    for i, entry in enumerate(first.manifest.parts):
        assert second.manifest.parts[i].sha256 == entry.sha256
        a, b = (first.root / entry.path).stat(), (second.root / entry.path).stat()
        assert (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
    new_rows = sum(p.rows for p in second.manifest.parts[len(first.manifest.parts) :])
    assert new_rows == 540  # only the outstanding items were computed
    ids = _ids(second)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(_ids(inp))
    assert verify(first.root).identity == first.identity  # the earlier version is intact
    assert compute.manifest_url(job, st.latest_version_id) == str(first.root)


def test_resubmit_with_the_same_key_starts_one_attempt(tmp_path, digits):
    compute = LocalCompute(tmp_path, executor="inline")
    job = compute.submit(digits.spec(faults=FaultSpec(lose_parts=2)))
    st = compute.status(job)
    assert st.state == "PARTIAL" and st.outstanding == 600  # two whole parts of 300
    v1 = st.latest_version_id
    assert compute.resubmit(job, from_version_id=v1, idempotency_key="k") == 2
    assert compute.resubmit(job, from_version_id=v1, idempotency_key="k") == 2
    st2 = compute.status(job)
    assert st2.attempt == 2 and len(st2.versions) == 2 and st2.state == "SUCCEEDED"
    with pytest.raises(InvalidResubmission, match="not the latest"):
        compute.resubmit(job, from_version_id=v1, idempotency_key="other")
    with pytest.raises(InvalidResubmission, match="expected PARTIAL"):
        compute.resubmit(job, from_version_id=st2.latest_version_id, idempotency_key="k3")
    with pytest.raises(InvalidResubmission, match="was used for version"):
        compute.resubmit(job, from_version_id=st2.latest_version_id, idempotency_key="k")
    with pytest.raises(UnknownJob):
        compute.status("no-such-job")


def test_every_resubmission_losing_items_stays_partial_with_growing_attempts(tmp_path, digits):
    compute = LocalCompute(tmp_path, executor="inline")
    faults = FaultSpec(lose_fraction=0.3, resubmit_lose_fraction=0.5)
    job = compute.submit(digits.spec(faults=faults))
    outstanding = [compute.status(job).outstanding]
    for n in range(2, 5):
        st = compute.status(job)
        assert (
            compute.resubmit(job, from_version_id=st.latest_version_id, idempotency_key=str(n)) == n
        )
        st = compute.status(job)
        assert st.state == "PARTIAL" and st.attempt == n and len(st.versions) == n
        outstanding.append(st.outstanding)
    assert outstanding == [540, 270, 135, 68]
    latest = verify(compute.manifest_url(job))
    ids = _ids(latest) + pq.read_table(latest.root / fmt.OUTSTANDING_NAME)["image_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 1797  # each item exactly once: done or outstanding
    for v in compute.status(job).versions:  # every earlier version still verifies
        verify(compute.manifest_url(job, v))


def test_injected_failure_fails_the_job_without_a_bundle(tmp_path, digits):
    compute = LocalCompute(tmp_path, executor="inline")
    job = compute.submit(digits.spec(faults=FaultSpec(fail=True)))
    st = compute.status(job)
    assert st.state == "FAILED" and st.versions == [] and st.latest_manifest_url is None
    assert "injected failure" in st.message
    assert not (tmp_path / "results" / job).exists()
    with pytest.raises(ComputeError, match="no version"):
        compute.manifest_url(job)


def test_a_bad_input_location_fails_the_job_naming_it(tmp_path, digits):
    compute = LocalCompute(tmp_path / "c", executor="inline")
    job = compute.submit(digits.spec().model_copy(update={"input_url": str(tmp_path / "nope")}))
    st = compute.status(job)
    assert st.state == "FAILED" and "IncompleteBundle" in st.message and "nope" in st.message


def test_transient_status_errors_are_counted_on_disk_across_clients(tmp_path, digits):
    one = LocalCompute(tmp_path, executor="inline")
    two = LocalCompute(tmp_path, executor="inline")
    job = one.submit(digits.spec(faults=FaultSpec(transient_status_errors=3)))
    for client in (one, two, one):
        with pytest.raises(ComputeUnavailable, match="transient"):
            client.status(job)
    assert two.status(job).state == "SUCCEEDED"
    assert one.status(job).state == "SUCCEEDED"
    assert two.list_jobs() == [job]


def test_per_item_failures_are_results_with_status_failed(tmp_path, digits):
    compute = LocalCompute(tmp_path / "compute", executor="inline")
    job = compute.submit(digits.spec(faults=FaultSpec(fail_item_fraction=0.05)))
    st = compute.status(job)
    assert st.state == "SUCCEEDED"  # a failed item has a result; it is not outstanding
    snap = verify(compute.manifest_url(job))
    table = _table(snap)
    failed = table.filter(pc.equal(table[fmt.STATUS_COLUMN], "failed"))
    assert snap.manifest.counts.failed == failed.num_rows == round(0.05 * table.num_rows)
    assert failed[fmt.CONFIDENCE_COLUMN].null_count == failed.num_rows
    assert failed["lithi_label"].null_count == failed.num_rows
    assert set(failed[fmt.VERIFICATION_COLUMN].to_pylist()) == {"not_run"}


# -- job ids: one rule at every entry point --------------------------------------------------

BAD_JOB_IDS = ["../../outside/evil", "../evil", "a/b", "", ".hidden", "x" * 129, "j\nk"]


def _plant_outside(tmp_path, job_id: str) -> None:
    """A job.json where ``jobs/<job_id>/`` would resolve to, outside the Compute root."""
    record = {
        "job_id": job_id,
        "spec": {"input_url": "x", "reference_url": "y"},
        "attempts": [{"number": 1, "token": "t"}],
        "state": "SUCCEEDED",
        "versions": ["v1"],
    }
    target = tmp_path / "compute" / "jobs" / job_id / "job.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record))


@pytest.mark.parametrize("job_id", BAD_JOB_IDS)
def test_a_job_id_that_is_not_one_path_segment_is_refused_everywhere(tmp_path, job_id):
    compute = LocalCompute(tmp_path / "compute", executor="inline")
    if job_id.startswith("../"):
        _plant_outside(tmp_path, job_id)
    calls = {
        "status": lambda: compute.status(job_id),
        "resubmit": lambda: compute.resubmit(job_id, from_version_id="v1", idempotency_key="k"),
        "manifest_url": lambda: compute.manifest_url(job_id),
        "manifest_url of a version": lambda: compute.manifest_url(job_id, "v1"),
        "results_dir": lambda: results_dir(compute.root, job_id),
        "run_attempt": lambda: run_attempt(compute.root, job_id, 1),
        "job store": lambda: compute.jobs.load(job_id),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidJobId, match="is not valid"):
            call()
            pytest.fail(f"{name} accepted job id {job_id!r}")
    assert worker_main([str(compute.root), job_id, "1"]) == 2
    assert compute.list_jobs() == [] and compute.latest_job() is None


def test_a_planted_record_under_another_name_is_refused(tmp_path):
    compute = LocalCompute(tmp_path / "compute", executor="inline")
    _plant_outside(tmp_path, "real")
    data = json.loads((compute.jobs.jobs_dir / "real" / "job.json").read_text())
    data["job_id"] = "../../outside/evil"
    (compute.jobs.jobs_dir / "real" / "job.json").write_text(json.dumps(data))
    with pytest.raises(ComputeError, match="records job '../../outside/evil', expected 'real'"):
        compute.status("real")


@pytest.mark.parametrize("version_id", ["../../x", "a/b", ""])
def test_a_version_id_that_is_not_one_path_segment_is_refused(tmp_path, version_id):
    compute = LocalCompute(tmp_path / "compute", executor="inline")
    with pytest.raises(InvalidResubmission, match="not a valid version id"):
        compute.resubmit("job-1", from_version_id=version_id, idempotency_key="k")
    with pytest.raises(UnknownJob, match="not a valid version id"):
        compute.manifest_url("job-1", version_id)
