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

import dagster as dg

from pipeline.defs.jobs import CHAIN_JOB_NAME, FINISHED_RUN_STATUSES, chain_job
from pipeline.defs.partial_policy import Action
from pipeline.defs.sensor import run_request_for
from resources.compute.client import ComputeError, ComputeUnavailable
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import ComputeResource
from resources.settings import SettingsError

SCHEDULE_NAME = "compute_chain_schedule"


def chain_runs(instance: dg.DagsterInstance, job_id: str, version_id: str) -> list[dg.DagsterRun]:
    """Every chain run recorded for one version of one job (by the sensor, schedule or hand)."""
    return instance.get_runs(
        filters=dg.RunsFilter(
            job_name=CHAIN_JOB_NAME,
            tags={"lithi/job_id": job_id, "lithi/version_id": version_id},
        )
    )


def schedule_tick(
    context: dg.ScheduleEvaluationContext, compute: ComputeResource, settings: ChainSettings
) -> list[dg.RunRequest] | dg.SkipReason:
    """The run requests of one tick, or why there are none."""
    client = compute.client()
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
        runs = chain_runs(context.instance, job_id, version)
        if any(r.status == dg.DagsterRunStatus.SUCCESS for r in runs):
            reasons.append(f"{job_id}: the chain of {version} already succeeded; nothing new")
            continue
        if any(r.status not in FINISHED_RUN_STATUSES for r in runs):
            reasons.append(f"{job_id}: a chain run for {version} is queued or running")
            continue
        action = Action("chain", job_id, version, status.attempt)
        request = run_request_for(action, trigger="schedule")
        scheduled = context.scheduled_execution_time
        stamp = scheduled.strftime("%Y%m%dT%H%M") if scheduled else "now"
        requests.append(request.with_replaced_attrs(run_key=f"schedule:{job_id}:{version}:{stamp}"))
    if requests:
        return requests
    return dg.SkipReason("; ".join(reasons) or "no Compute jobs are watched")


def chain_schedule(cron: str) -> dg.ScheduleDefinition:
    """The schedule on ``cron`` (UTC), on by default."""
    try:

        @dg.schedule(
            name=SCHEDULE_NAME,
            job=chain_job,
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
        ):
            return schedule_tick(context, compute, chain_settings)

    except dg.DagsterInvalidDefinitionError as e:
        raise SettingsError(f"LITHI_CHAIN_CRON={cron!r}: not a cron schedule ({e})") from None
    return compute_chain_schedule
