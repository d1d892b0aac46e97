"""The PARTIAL sensor, driven tick by tick with Dagster's own test helpers over a real Compute.

Every test runs the real local Compute (inline executor, state on disk under ``tmp_path``) on the
wine sample, a temporary Dagster instance, and the sensor as the code location defines it. The
runs the sensor asks for are executed in-process, tagged exactly as the daemon tags them, so the
run-key deduplication the daemon applies can be checked against the instance's own run records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pyarrow.parquet as pq
import pytest

from pipeline.bundle.verify import verify
from pipeline.defs import samples
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import (
    CHAIN_JOB_NAME,
    RESUBMIT_JOB_NAME,
    chain_run_config,
    idempotency_key,
    resubmit_job,
    resubmit_run_config,
)
from pipeline.defs.partial_policy import Cursor
from pipeline.defs.sensor import SENSOR_NAME, compute_partial_sensor
from pipeline.defs.sensor import tick as sensor_tick
from resources.compute.client import JobSpec
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.compute.local.jobstore import JobStore
from resources.dagster.clients import ComputeResource
from tests.helpers.chain import chain_resources

# The tag names the daemon stamps on sensor runs and dedupes by (dagster/_daemon/sensor.py).
from tests.helpers.dagster_internals import RUN_KEY_TAG, SENSOR_NAME_TAG

MANIFEST_ONLY = [dg.AssetKey("result_manifest")]  # the chain's first link: cheap, reads the pin


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    """The wine sample staged once; each test's Compute fetches it into its own cache."""
    return samples.stage_sample("wine", tmp_path_factory.mktemp("staged"))


@pytest.fixture(scope="module")
def instance():
    """One temporary instance for the module; every test watches a job id of its own."""
    with dg.instance_for_test() as instance:
        yield instance


@dataclass
class Setup:
    """One Compute job under ``home`` and the code location whose sensor watches it."""

    home: Path
    job: str
    resources: dict

    @property
    def compute(self) -> LocalCompute:
        return LocalCompute(self.home / "compute", executor="inline")

    @cached_property
    def defs(self) -> dg.Definitions:
        return build_definitions(**self.resources)

    def with_settings(self, **settings: object) -> Setup:
        return Setup(self.home, self.job, chain_resources(self.home, self.job, **settings))


def start(home: Path, wine, job: str, faults: FaultSpec | None = None, **settings) -> Setup:
    """Submit the wine job with ``faults`` to an inline local Compute: it has ended on return."""
    inp, ref = wine
    LocalCompute(home / "compute", executor="inline").submit(
        JobSpec(
            input_url=str(inp.root),
            reference_url=str(ref.root),
            job_id=job,
            idempotency_key=job,
            faults=faults or FaultSpec(),
            rows_per_part=50,  # 178 items in four parts, so reuse across versions is visible
        )
    )
    settings = {"base_delay_seconds": 0, **settings}
    return Setup(home, job, chain_resources(home, job, **settings))


@dataclass
class Tick:
    requests: list[dg.RunRequest]
    skip: str | None
    cursor: str | None


def tick(instance: dg.DagsterInstance, setup: Setup, cursor: str | None = None) -> Tick:
    """One evaluation of the sensor from the code location, with its resources, like the daemon."""
    defs = setup.defs
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources=setup.resources
    ) as context:
        data = sensor.evaluate_tick(context)
    return Tick(list(data.run_requests or []), data.skip_message, data.cursor)


def tick_at(instance: dg.DagsterInstance, setup: Setup, cursor: str | None, now: float) -> Tick:
    """One evaluation with an explicit clock (``tick`` is the sensor's whole body)."""
    res = setup.resources
    with dg.build_sensor_context(instance=instance, cursor=cursor) as context:
        result = sensor_tick(
            context, res["compute"], res["chain_settings"], res["bundle_store"], now=now
        )
    skip = result.skip_reason.skip_message if result.skip_reason else None
    return Tick(list(result.run_requests or []), skip, result.cursor)


def launch(instance, setup: Setup, request: dg.RunRequest, **kwargs) -> dg.ExecuteInProcessResult:
    """Run what the daemon would launch for ``request``: its job, its config, its tags + run key."""
    job = setup.defs.resolve_job_def(request.job_name)
    tags = {**request.tags, SENSOR_NAME_TAG: SENSOR_NAME, RUN_KEY_TAG: request.run_key}
    result = job.execute_in_process(
        run_config=request.run_config, instance=instance, tags=tags, **kwargs
    )
    assert result.success
    return result


def runs_with_key(instance: dg.DagsterInstance, run_key: str) -> list[dg.DagsterRun]:
    """The runs the daemon finds for a run key before launching a request (``fetch_existing_runs``
    in dagster/_daemon/sensor.py): if one has started, the request is skipped."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}))
    return [r for r in runs if r.tags.get(SENSOR_NAME_TAG) == SENSOR_NAME]


def item_ids(bundle_root: str | Path) -> list[str]:
    snap = verify(bundle_root)
    idf = snap.manifest.item_id_field
    return [i for p in snap.part_paths() for i in pq.read_table(p, columns=[idf])[idf].to_pylist()]


def manifest_meta(result: dg.ExecuteInProcessResult) -> dict:
    """The metadata the chain's first asset recorded: which version it read."""
    (mat,) = result.asset_materializations_for_node("result_manifest")
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def job_runs(instance: dg.DagsterInstance, job: str) -> list[dg.DagsterRun]:
    """Every run the sensor's requests produced for one Compute job."""
    return instance.get_runs(filters=dg.RunsFilter(tags={"lithi/job_id": job}))


# -- wiring ----------------------------------------------------------------------------------


def test_the_code_location_serves_the_sensor_with_both_targets(tmp_path):
    defs = Setup(tmp_path, "wine-w", chain_resources(tmp_path, "wine-w")).defs
    assert defs.get_unresolved_sensor_def(SENSOR_NAME) is compute_partial_sensor
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    assert {t.job_name for t in sensor.targets} == {CHAIN_JOB_NAME, RESUBMIT_JOB_NAME}
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


# -- SUCCEEDED -------------------------------------------------------------------------------


def test_a_succeeded_version_gets_one_chain_run_pinned_to_it(tmp_path, wine, instance):
    setup = start(tmp_path, wine, "wine-ok")
    job = setup.job
    v = setup.compute.status(job).latest_version_id
    first = tick(instance, setup)
    assert len(first.requests) == 1 and first.skip is None
    req = first.requests[0]
    assert req.job_name == CHAIN_JOB_NAME
    assert req.run_key == f"chain:{job}:{v}"
    assert req.run_config == chain_run_config(job, v).to_config_dict()
    assert req.run_config["ops"]["result_manifest"]["config"]["version_id"] == v
    assert req.tags["lithi/version_id"] == v and req.tags["lithi/allow_partial"] == "false"

    cursor = first.cursor
    for _ in range(10):
        again = tick(instance, setup, cursor)
        assert again.requests == []
        assert again.skip == f"{job}: version {v} is complete and already requested"
        cursor = again.cursor

    # The request runs as the daemon would launch it, and the chain reads the pinned version.
    meta = manifest_meta(launch(instance, setup, req, asset_selection=MANIFEST_ONLY))
    assert meta["snapshot/version_id"] == v and meta["job_status"] == "SUCCEEDED"
    assert len(runs_with_key(instance, req.run_key)) == 1


# -- PARTIAL → resubmission → newer manifest -------------------------------------------------


def test_partial_is_resubmitted_once_and_the_newer_manifest_is_chained(tmp_path, wine, instance):
    setup = start(tmp_path, wine, "wine-partial", FaultSpec(lose_fraction=0.3))
    job = setup.job
    st = setup.compute.status(job)
    v1 = st.latest_version_id
    assert st.state == "PARTIAL" and st.outstanding == 54  # ceil(0.3 * 178)
    first = tick(instance, setup)
    assert len(first.requests) == 1
    req = first.requests[0]
    assert req.job_name == RESUBMIT_JOB_NAME
    assert req.run_key == f"resubmit:{job}:{v1}"
    assert req.run_config == resubmit_run_config(job, v1).to_config_dict()
    assert req.tags["lithi/version_id"] == v1
    assert req.tags["lithi/trigger"] == "partial_resubmit"

    cursor = first.cursor
    for _ in range(10):  # the run has not happened yet: still one request in all
        again = tick(instance, setup, cursor)
        assert again.requests == []
        assert again.skip == f"{job}: resubmitted {v1}; waiting for the newer manifest"
        cursor = again.cursor

    result = launch(instance, setup, req)
    assert result.output_for_node("resubmit_outstanding") == 2

    st = setup.compute.status(job)
    assert st.state == "SUCCEEDED" and st.attempt == 2 and st.versions[0] == v1
    v2 = st.latest_version_id
    newer = verify(setup.compute.manifest_url(job, v2))
    assert newer.manifest.job.parent_version_id == v1
    assert newer.manifest.counts.items == 178 and newer.manifest.counts.outstanding == 0
    assert verify(setup.compute.manifest_url(job, v1)).manifest.is_partial  # still intact

    chained = tick(instance, setup, cursor)
    assert [r.run_key for r in chained.requests] == [f"chain:{job}:{v2}"]
    assert chained.requests[0].run_config == chain_run_config(job, v2).to_config_dict()
    cursor = chained.cursor
    for _ in range(5):
        again = tick(instance, setup, cursor)
        assert again.requests == [] and "already requested" in again.skip
        cursor = again.cursor

    meta = manifest_meta(
        launch(instance, setup, chained.requests[0], asset_selection=MANIFEST_ONLY)
    )
    assert meta["snapshot/version_id"] == v2 and meta["parent_version_id"] == v1
    assert Counter(r.job_name for r in job_runs(instance, job)) == {
        RESUBMIT_JOB_NAME: 1,
        CHAIN_JOB_NAME: 1,
    }


def test_resubmission_waits_a_delay_that_grows_with_the_attempt(tmp_path, wine, instance):
    faults = FaultSpec(lose_fraction=0.3, resubmit_lose_fraction=0.5)
    setup = start(tmp_path, wine, "wine-backoff", faults, base_delay_seconds=10, max_attempts=3)
    job = setup.job
    v1 = setup.compute.status(job).latest_version_id
    t = tick_at(instance, setup, None, now=1000)
    assert t.requests == []
    assert t.skip == f"{job}: PARTIAL (54 outstanding); resubmitting in 10s (attempt 2/3)"
    t = tick_at(instance, setup, t.cursor, now=1009.5)
    assert t.requests == []
    t = tick_at(instance, setup, t.cursor, now=1010)
    assert [r.run_key for r in t.requests] == [f"resubmit:{job}:{v1}"]
    req, cursor = t.requests[0], t.cursor
    for now in (1010, 1011, 5000):
        t = tick_at(instance, setup, cursor, now=now)
        assert t.requests == []
        cursor = t.cursor

    launch(instance, setup, req)
    st = setup.compute.status(job)
    v2 = st.latest_version_id
    assert st.state == "PARTIAL" and st.attempt == 2 and v2 != v1

    t = tick_at(instance, setup, cursor, now=6000)  # first sight of v2: the clock starts
    assert t.requests == []
    assert "resubmitting in 20s (attempt 3/3)" in t.skip
    t = tick_at(instance, setup, t.cursor, now=6019)
    assert t.requests == []
    t = tick_at(instance, setup, t.cursor, now=6020)
    assert [r.run_key for r in t.requests] == [f"resubmit:{job}:{v2}"]


# -- a lost cursor, a crash between resubmission and cursor update ---------------------------


def test_a_lost_cursor_repeats_the_run_key_and_the_daemon_drops_it(tmp_path, wine, instance):
    setup = start(tmp_path, wine, "wine-lost")
    job = setup.job
    first = tick(instance, setup)
    (req,) = first.requests
    assert req.run_key == f"chain:{job}:{setup.compute.status(job).latest_version_id}"
    launch(instance, setup, req, asset_selection=MANIFEST_ONLY)

    lost = tick(instance, setup, cursor=None)  # the cursor is gone: the same request again
    (again,) = lost.requests
    assert again.run_key == req.run_key and again.run_config == req.run_config
    # ...which the daemon drops: a started run already carries that key for this sensor.
    (existing,) = runs_with_key(instance, again.run_key)
    assert existing.status == dg.DagsterRunStatus.SUCCESS

    restored = tick(instance, setup, cursor=first.cursor)
    assert restored.requests == [] and "already requested" in restored.skip


def test_a_crash_between_resubmission_and_cursor_update_resubmits_once(tmp_path, wine, instance):
    setup = start(tmp_path, wine, "wine-crash", FaultSpec(lose_fraction=0.3))
    job = setup.job
    compute = setup.compute
    v1 = compute.status(job).latest_version_id
    input_ids = item_ids(wine[0].root)
    old_cursor = None
    (req,) = tick(instance, setup, old_cursor).requests
    # Crash: the tick's cursor is never saved. A restarted daemon evaluates the old one
    # before the resubmission ran, and asks for the same run key (deduplicated).
    (repeat,) = tick(instance, setup, old_cursor).requests
    assert repeat.run_key == req.run_key == f"resubmit:{job}:{v1}"

    # The resubmission runs, and runs again as a retry or duplicate launch would.
    config = resubmit_run_config(job, v1)
    assert req.run_config == config.to_config_dict()
    compute_resource = ComputeResource(root=str(tmp_path / "compute"), executor="inline")
    attempts = []
    for _ in range(2):
        result = resubmit_job.execute_in_process(
            run_config=config,
            resources={
                "compute": compute_resource,
                "bundle_store": setup.resources["bundle_store"],
                "chain_settings": setup.resources["chain_settings"],
            },
            instance=instance,
        )
        assert result.success
        attempts.append(result.output_for_node("resubmit_outstanding"))
    assert attempts == [2, 2]

    rec = JobStore(tmp_path / "compute").load(job)
    assert [a.number for a in rec.attempts] == [1, 2]  # exactly one new attempt
    new = rec.attempts[1]
    assert new.idempotency_key == idempotency_key(job, v1) and new.from_version_id == v1
    assert new.items == 54 and new.lost == 0

    st = compute.status(job)
    assert st.state == "SUCCEEDED" and len(st.versions) == 2
    v2 = st.latest_version_id
    ids = item_ids(compute.manifest_url(job, v2))
    assert len(ids) == len(set(ids)) == len(input_ids) == 178  # no item twice, none missing
    assert set(ids) == set(input_ids)
    older = verify(compute.manifest_url(job, v1))
    newer = verify(compute.manifest_url(job, v2))
    assert {p.sha256 for p in older.manifest.parts} <= {p.sha256 for p in newer.manifest.parts}

    # The old cursor after the resubmission: no second resubmission, the newer version chains.
    after = tick(instance, setup, old_cursor)
    assert [r.run_key for r in after.requests] == [f"chain:{job}:{v2}"]
    cursor = after.cursor
    for _ in range(5):
        again = tick(instance, setup, cursor)
        assert again.requests == []
        cursor = again.cursor
    assert v1 not in Cursor.from_json(cursor).jobs[job].resubmit_requested


# -- attempts exhausted, FAILED, unreachable -------------------------------------------------


def _tick_until_quiet(instance, setup: Setup, cursor: str | None, ticks: int = 12):
    """Tick repeatedly, executing every resubmission asked for; return requests and last tick."""
    requests, last = [], None
    for _ in range(ticks):
        last = tick(instance, setup, cursor)
        cursor = last.cursor
        for r in last.requests:
            requests.append(r)
            if r.job_name == RESUBMIT_JOB_NAME:
                launch(instance, setup, r)
    return requests, last


def test_every_resubmission_losing_items_stops_at_max_attempts_and_trains_nothing(
    tmp_path, wine, instance
):
    faults = FaultSpec(lose_fraction=0.3, resubmit_lose_fraction=0.5)
    setup = start(tmp_path, wine, "wine-exhaust", faults, max_attempts=3)
    job = setup.job
    requests, last = _tick_until_quiet(instance, setup, None)
    st = setup.compute.status(job)
    assert st.state == "PARTIAL" and st.attempt == 3 and len(st.versions) == 3
    v1, v2, v3 = st.versions
    assert [r.run_key for r in requests] == [f"resubmit:{job}:{v1}", f"resubmit:{job}:{v2}"]
    assert last.requests == []
    assert last.skip == (
        f"{job}: PARTIAL after 3/3 attempts, {st.outstanding} items outstanding; "
        "not training on incomplete data (train_on_partial is off)"
    )
    assert [r.job_name for r in job_runs(instance, job)] == [RESUBMIT_JOB_NAME] * 2

    # Told to train on the accepted parts: one chain run, marked partial, and no more.
    allowed = setup.with_settings(base_delay_seconds=0, max_attempts=3, train_on_partial=True)
    more, last_allowed = _tick_until_quiet(instance, allowed, last.cursor, ticks=6)
    (req,) = more
    assert req.job_name == CHAIN_JOB_NAME and req.run_key == f"chain:{job}:{v3}:partial"
    assert req.run_config == chain_run_config(job, v3, allow_partial=True).to_config_dict()
    assert req.tags["lithi/allow_partial"] == "true"
    assert "already requested" in last_allowed.skip
    assert setup.compute.status(job).attempt == 3  # no resubmission beyond the maximum

    meta = manifest_meta(launch(instance, allowed, req, asset_selection=MANIFEST_ONLY))
    assert meta["snapshot/version_id"] == v3 and meta["outstanding"] == st.outstanding > 0


def test_a_failed_job_is_reported_and_nothing_is_requested(tmp_path, wine, instance):
    setup = start(tmp_path, wine, "wine-fail", FaultSpec(fail=True))
    job = setup.job
    assert setup.compute.status(job).state == "FAILED"
    cursor = None
    for _ in range(3):
        t = tick(instance, setup, cursor)
        assert t.requests == []
        assert f"{job}: FAILED" in t.skip and "injected failure" in t.skip
        cursor = t.cursor
    assert job_runs(instance, job) == []


def test_unreachable_compute_is_reported_and_the_next_tick_proceeds(tmp_path, wine, instance):
    faults = FaultSpec(lose_fraction=0.3, transient_status_errors=2)
    setup = start(tmp_path, wine, "wine-flaky", faults, base_delay_seconds=10)
    job = setup.job
    cursor = None
    for now in (1000, 1001):
        t = tick_at(instance, setup, cursor, now=now)
        assert t.requests == []
        assert f"{job}: Compute unreachable" in t.skip and "try again next tick" in t.skip
        assert Cursor.from_json(t.cursor) == Cursor()  # nothing recorded, no clock started
        cursor = t.cursor
    t = tick_at(instance, setup, cursor, now=1002)
    assert "resubmitting in 10s" in t.skip
    t = tick_at(instance, setup, t.cursor, now=1012)
    assert [r.job_name for r in t.requests] == [RESUBMIT_JOB_NAME]


def test_an_outage_mid_back_off_keeps_the_cursor_and_the_clock(tmp_path, wine, instance):
    setup = start(
        tmp_path, wine, "wine-outage", FaultSpec(lose_fraction=0.3), base_delay_seconds=10
    )
    job = setup.job
    seen = tick_at(instance, setup, None, now=1000)
    assert seen.requests == [] and "resubmitting in 10s" in seen.skip
    # The service starts failing status calls (the same fault counter, set mid-flight).
    with JobStore(tmp_path / "compute").edit(job) as rec:
        rec.status_errors_left = 2
    cursor = seen.cursor
    for now in (1010, 1011):  # due, but Compute cannot be asked
        t = tick_at(instance, setup, cursor, now=now)
        assert t.requests == [] and "Compute unreachable" in t.skip
        assert t.cursor == seen.cursor
        cursor = t.cursor
    t = tick_at(instance, setup, cursor, now=1012)  # back: the delay is not restarted
    assert [r.job_name for r in t.requests] == [RESUBMIT_JOB_NAME]


def test_an_unknown_watched_job_is_reported_and_does_not_stall_the_others(tmp_path, wine, instance):
    setup = start(tmp_path, wine, "wine-known", watch_jobs="wine-ghost, wine-known")
    t = tick(instance, setup)
    assert [r.run_key.split(":")[1] for r in t.requests] == ["wine-known"]

    alone = Setup(setup.home, "wine-ghost", chain_resources(setup.home, "wine-ghost"))
    for _ in range(2):  # reported on every tick, never raised
        t = tick(instance, alone)
        assert t.requests == []
        assert t.skip.startswith("wine-ghost: Compute refused the status call (UnknownJob")


class _Said:
    """What a tick logs (the daemon writes each line to its log)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)


def test_ticks_over_unchanged_jobs_log_nothing(tmp_path, wine, instance):
    """The daemon ticks every few seconds: the state table is logged when it changes only."""
    setup = start(tmp_path, wine, "wine-quiet")
    res = setup.resources
    cursor = None
    logged = []
    for _ in range(5):
        said = _Said()
        context = SimpleNamespace(cursor=cursor, instance=instance, log=said)
        result = sensor_tick(context, res["compute"], res["chain_settings"], res["bundle_store"])
        cursor = result.cursor
        logged.append([line for line in said.lines if line.startswith("watched jobs")])
    # the first tick shows the job and its decision; the second, the decision to wait; then
    # nothing changes and nothing is said
    assert [len(lines) for lines in logged] == [1, 1, 0, 0, 0]
    assert "chain" in logged[0][0] and "wait" in logged[1][0]
