"""The PARTIAL-job sensor: Dagster wiring around :func:`pipeline.defs.partial_policy.decide`.

Each tick asks Compute for the status of the watched jobs and emits RunRequests only: a chain
rebuild for a complete (or, if allowed, exhausted PARTIAL) version, or a run of the resubmission
job for a PARTIAL version. Run keys name (what, job, version), so a tick repeated after a crash
or a lost cursor is deduplicated by Dagster; the resubmission carries an idempotency key that the
Compute side honours, so a crash between "resubmitted" and "cursor saved" cannot resubmit twice.
"""

import functools
import json
import time

import dagster as dg

from assets.chain_keys import DEFAULT_CHAIN, chain_key
from assets.compute_versions import observation
from assets.model_currency import evaluation, model_version
from pipeline.bundle.errors import BundleError
from pipeline.bundle.manifest import Manifest
from pipeline.defs.jobs import (
    FINISHED_RUN_STATUSES,
    RESUBMIT_JOB_NAME,
    chain_job_for,
    chain_job_name,
    chain_run_config,
    chain_runs,
    resubmit_job,
    resubmit_run_config,
)
from pipeline.defs.partial_policy import Action, Cursor, JobCursor, Observed, decide
from resources.bundle_store import BundleStore
from resources.compute.client import ComputeClient, ComputeError, ComputeUnavailable, describe
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource, source_client

SENSOR_NAME = "compute_partial_sensor"


def tags_for(action: Action, trigger: str | None = None, chain: str = "") -> dict[str, str]:
    """The ``lithi/*`` run tags of an action: the sensor's and the schedule's runs share them;
    a named chain's runs say which chain (``lithi/chain``)."""
    return ({"lithi/chain": chain} if chain else {}) | {
        "lithi/job_id": action.job_id,
        "lithi/version_id": action.version_id,
        "lithi/attempt": str(action.attempt),
        "lithi/trigger": trigger
        or ("newer_manifest" if action.kind == "chain" else "partial_resubmit"),
        "lithi/allow_partial": str(action.allow_partial).lower(),
        "lithi/retry": str(action.retry),
    }


def run_request_for(action: Action, trigger: str | None = None, chain: str = "") -> dg.RunRequest:
    """The RunRequest for one decided action of ``chain``, keyed so it can never launch twice."""
    if action.kind == "chain":
        return dg.RunRequest(
            run_key=action.run_key,
            job_name=chain_job_name(chain),
            run_config=chain_run_config(action.job_id, action.version_id, action.allow_partial),
            tags=tags_for(action, trigger, chain),
        )
    return dg.RunRequest(
        run_key=action.run_key,
        job_name=RESUBMIT_JOB_NAME,
        run_config=resubmit_run_config(action.job_id, action.version_id, chain),
        tags=tags_for(action, trigger, chain),
    )


def _resubmit_runs(
    instance: dg.DagsterInstance | None, job_id: str, version_id: str | None
) -> tuple[int, bool]:
    """How many resubmission runs for this version failed, and whether one is still going."""
    if instance is None or version_id is None:
        return 0, False
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            job_name=RESUBMIT_JOB_NAME,
            tags={"lithi/job_id": job_id, "lithi/version_id": version_id},
        )
    )
    # A run that failed, that run monitoring failed (it never started), or that was canceled
    # resubmitted nothing for sure: each counts as one that did not get through.
    ended = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
    failed = sum(r.status in ended for r in runs)
    active = any(r.status not in FINISHED_RUN_STATUSES for r in runs)
    return failed, active


def _chain_runs(
    instance: dg.DagsterInstance | None, chain: str, job_id: str, version_id: str | None
) -> tuple[int, bool, bool]:
    """The chain's runs for this version: how many failed, whether one is still going, whether
    one succeeded."""
    if instance is None or version_id is None:
        return 0, False, False
    runs = chain_runs(instance, job_id, version_id, chain)
    failed = sum(r.status == dg.DagsterRunStatus.FAILURE for r in runs)
    active = any(r.status not in FINISHED_RUN_STATUSES for r in runs)
    return failed, active, any(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)


def _observations(
    job_id: str,
    versions: list[str],
    seen: list[str],
    client: ComputeClient,
    store: BundleStore,
    credential_ref: str | None,
    key: dg.AssetKey,
) -> list[dg.AssetObservation]:
    """One observation per version not seen before, oldest first (its parent read for the
    change by status); ``seen`` is extended with the versions observed."""
    manifests: dict[str, Manifest] = {}

    def manifest(version: str) -> Manifest:
        if version not in manifests:
            url = client.bundle_url(job_id, version)
            manifests[version] = store.read_manifest(url, credential_ref)
        return manifests[version]

    out = []
    for version in versions:
        if version in seen:
            continue
        m = manifest(version)
        parent_id = m.job.parent_version_id if m.job is not None else None
        parent = manifest(parent_id) if parent_id in versions else None
        out.append(observation(job_id, m, client.bundle_url(job_id, version), parent, key))
        seen.append(version)
    return out


def _currency(
    instance: dg.DagsterInstance | None, cursor: Cursor, chain: str, latest: dict[str, str]
) -> list[dg.AssetCheckEvaluation]:
    """``model_is_current`` on the chain's model, when what it would say has changed since it
    was last reported (and there is a complete version to compare with)."""
    if instance is None or not latest:
        return []
    key = chain_key(chain, "training_run")
    model = model_version(instance, key)
    state = json.dumps([model, latest], sort_keys=True)
    if state == cursor.currency:
        return []
    cursor.currency = state
    return [evaluation(key, model, latest)]


def _state_table(rows: list[list[str]]) -> str:
    """The sensor's view of every watched job, as a table for the tick's log."""
    header = ["job", "state", "attempt", "latest version", "outstanding", "decision"]
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    lines += [" | ".join(r) for r in rows]
    return "\n".join(lines)


def tick(
    context: dg.SensorEvaluationContext,
    compute: ComputeResource,
    settings: ChainSettings,
    bundle_store: BundleStoreResource,
    now: float | None = None,
    chain: str = DEFAULT_CHAIN,
) -> dg.SensorResult:
    """One tick of ``chain``'s sensor: observe every job it watches, decide, and return
    requests plus the new cursor.

    Besides run requests, every result version seen for the first time is recorded as an
    observation of the chain's ``compute_versions`` (PARTIAL ones too).
    """
    now = time.time() if now is None else now
    cursor = Cursor.from_json(context.cursor)
    settings = settings.for_chain(chain)
    client = source_client(compute, bundle_store, settings)
    store = bundle_store.store()
    policy = settings.policy
    requests: list[dg.RunRequest] = []
    reasons: list[str] = []
    events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
    rows: list[list[str]] = []
    latest_complete: dict[str, str] = {}
    for job_id in settings.watched_jobs(client):
        try:
            status = client.status(job_id)
        except ComputeUnavailable as e:
            # Nothing is recorded for this job, so the next tick sees the same state again.
            reasons.append(f"{job_id}: Compute unreachable ({e}); will try again next tick")
            continue
        except ComputeError as e:
            # An unknown or refused job is reported, not raised: it must not stall the others.
            reasons.append(f"{job_id}: Compute refused the status call ({type(e).__name__}: {e})")
            continue
        failures, active = _resubmit_runs(context.instance, job_id, status.latest_version_id)
        chain_failures, chain_active, chain_succeeded = _chain_runs(
            context.instance, chain, job_id, status.latest_version_id
        )
        observed = Observed.of(
            job_id,
            status,
            resubmit_failures=failures,
            resubmit_active=active,
            chain_failures=chain_failures,
            chain_active=chain_active,
            chain_succeeded=chain_succeeded,
            can_resubmit=client.can_resubmit,
            client=describe(client),
        )
        job_cursor = cursor.jobs.setdefault(job_id, JobCursor())
        try:
            events += _observations(
                job_id,
                status.versions,
                job_cursor.observed,
                client,
                store,
                settings.credential_ref or None,
                chain_key(chain, "compute_versions"),
            )
        except (ComputeError, ComputeUnavailable, BundleError) as e:
            reasons.append(f"{job_id}: a version could not be read ({e}); observed next tick")
        if status.state == "SUCCEEDED" and status.latest_version_id:
            latest_complete[job_id] = status.latest_version_id
        decision = decide(observed, job_cursor, policy, now)
        requests += [run_request_for(a, chain=chain) for a in decision.actions]
        reasons += decision.reasons
        what = ", ".join(f"{a.kind} {a.version_id}" for a in decision.actions) or "wait"
        rows.append(
            [
                job_id,
                status.state,
                str(status.attempt),
                status.latest_version_id or "-",
                str(status.outstanding),
                what,
            ]
        )
    events += _currency(context.instance, cursor, chain, latest_complete)
    table = _state_table(rows) if rows else ""
    if table and table != cursor.logged:  # a tick where no job answered changes nothing
        context.log.info("watched jobs:\n" + table)
        cursor.logged = table
    if not requests:
        return dg.SensorResult(
            skip_reason=dg.SkipReason("; ".join(reasons) or "no Compute jobs are watched"),
            cursor=cursor.to_json(),
            asset_events=events,
        )
    for r in reasons:
        context.log.info(r)
    return dg.SensorResult(run_requests=requests, cursor=cursor.to_json(), asset_events=events)


def sensor_name(chain: str = DEFAULT_CHAIN) -> str:
    """The name of ``chain``'s sensor: ``<chain>_partial_sensor``, or today's for the default."""
    return f"{chain}_partial_sensor" if chain else SENSOR_NAME


def partial_sensor(chain: str = DEFAULT_CHAIN) -> dg.SensorDefinition:
    """The PARTIAL-job sensor of ``chain``: it watches that chain's source only and launches
    that chain's job. One object per chain, however often a code location is built."""
    return _partial_sensor(chain)


@functools.cache
def _partial_sensor(chain: str) -> dg.SensorDefinition:

    @dg.sensor(
        name=sensor_name(chain),
        jobs=[chain_job_for(chain), resubmit_job],
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Watches Compute jobs: resubmits the outstanding items of a PARTIAL version (once, "
            "with a growing delay, up to max_attempts) and rebuilds the chain from each newer "
            "complete manifest" + (f" (chain {chain})." if chain else ".")
        ),
    )
    def compute_partial_sensor(
        context: dg.SensorEvaluationContext,
        compute: ComputeResource,
        chain_settings: ChainSettings,
        bundle_store: BundleStoreResource,
    ) -> dg.SensorResult:
        """The sensor the daemon evaluates."""
        return tick(context, compute, chain_settings, bundle_store, chain=chain)

    return compute_partial_sensor


compute_partial_sensor = partial_sensor()
