"""The scheduled end-to-end run: the chain for the latest complete version, unless it is built.

Each tick asks Compute for every watched job's latest version. A complete (SUCCEEDED) version
whose chain has not run gets one chain run, pinned to that version and tagged exactly like the
sensor's runs (``lithi/job_id``, ``lithi/version_id``..., ``lithi/trigger=schedule``); a version
whose chain already succeeded, or is running, is skipped with the reason, so unchanged data is
never retrained. PARTIAL and FAILED versions are the sensor's business. The schedule is the
safety net behind the sensor: a version the sensor missed (turned off, a lost cursor) is built
on the next tick.
"""

from __future__ import annotations

import functools

import dagster as dg

from assets import DEFAULT_CHAIN
from pipeline.defs.jobs import FINISHED_RUN_STATUSES, chain_job_for, chain_runs
from pipeline.defs.partial_policy import Action
from pipeline.defs.sensor import run_request_for
from resources.compute.client import ComputeError, ComputeUnavailable
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource, source_client
from resources.settings import SettingsError

SCHEDULE_NAME = "compute_chain_schedule"


def schedule_tick(
    context: dg.ScheduleEvaluationContext,
    compute: ComputeResource,
    settings: ChainSettings,
    bundle_store: BundleStoreResource,
    chain: str = DEFAULT_CHAIN,
) -> list[dg.RunRequest] | dg.SkipReason:
    """The run requests of one tick of ``chain``'s schedule, or why there are none."""
    settings = settings.for_chain(chain)
    client = source_client(compute, bundle_store, settings)
    requests: list[dg.RunRequest] = []
    reasons: list[str] = []
    for job_id in settings.watched_jobs(client):
        try:
            status = client.status(job_id)
        except (ComputeError, ComputeUnavailable) as e:
            reasons.append(f"{job_id}: Compute did not answer ({type(e).__name__}: {e})")
            continue
        version = status.latest_version_id
        if status.state != "SUCCEEDED" or version is None:
            reasons.append(f"{job_id}: latest version is {status.state}; the sensor handles it")
            continue
        runs = chain_runs(context.instance, job_id, version, chain)
        if any(r.status == dg.DagsterRunStatus.SUCCESS for r in runs):
            reasons.append(f"{job_id}: the chain of {version} already succeeded; nothing new")
            continue
        if any(r.status not in FINISHED_RUN_STATUSES for r in runs):
            reasons.append(f"{job_id}: a chain run for {version} is queued or running")
            continue
        failed = sum(r.status == dg.DagsterRunStatus.FAILURE for r in runs)
        if failed:  # the same data would fail the same way: a person re-executes it
            reasons.append(
                f"{job_id}: the chain of {version} FAILED ({failed} run(s), retries included); "
                "not requested again: re-execute the failed run once its cause is fixed"
            )
            continue
        action = Action("chain", job_id, version, status.attempt)
        request = run_request_for(action, trigger="schedule", chain=chain)
        scheduled = context.scheduled_execution_time
        stamp = scheduled.strftime("%Y%m%dT%H%M") if scheduled else "now"
        requests.append(request.with_replaced_attrs(run_key=f"schedule:{job_id}:{version}:{stamp}"))
    if requests:
        return requests
    return dg.SkipReason("; ".join(reasons) or "no Compute jobs are watched")


def schedule_name(chain: str = DEFAULT_CHAIN) -> str:
    """The name of ``chain``'s schedule: ``<chain>_chain_schedule``, or today's for the default."""
    return f"{chain}_chain_schedule" if chain else SCHEDULE_NAME


def chain_schedule(cron: str, chain: str = DEFAULT_CHAIN) -> dg.ScheduleDefinition:
    """``chain``'s schedule on ``cron`` (UTC), on by default: one object per chain and cron,
    however often a code location is built."""
    return _chain_schedule(cron, chain)


@functools.cache
def _chain_schedule(cron: str, chain: str) -> dg.ScheduleDefinition:
    try:

        @dg.schedule(
            name=schedule_name(chain),
            job=chain_job_for(chain),
            cron_schedule=cron,
            execution_timezone="UTC",
            default_status=dg.DefaultScheduleStatus.RUNNING,
            description="Build the chain for each watched job's latest complete version, unless "
            "it is already built: the safety net behind the sensor.",
        )
        def compute_chain_schedule(
            context: dg.ScheduleEvaluationContext,
            compute: ComputeResource,
            chain_settings: ChainSettings,
            bundle_store: BundleStoreResource,
        ):
            return schedule_tick(context, compute, chain_settings, bundle_store, chain)

    except dg.DagsterInvalidDefinitionError as e:
        raise SettingsError(f"LITHI_CHAIN_CRON={cron!r}: not a cron schedule ({e})") from None
    return compute_chain_schedule
