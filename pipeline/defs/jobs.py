"""The Dagster jobs: the end-to-end chain over the asset group, and the resubmission job.

A resubmission is a job rather than a side effect of a sensor tick, so it is visible, logged and
retryable in the UI; its idempotency key makes a retry of the same request harmless.
"""

import dagster as dg

from assets import CHAIN_GROUP
from resources.compute.client import ComputeUnavailable
from resources.dagster_resources import BundleStoreResource, ComputeResource

#: Run statuses after which a run does nothing more.
FINISHED_RUN_STATUSES = frozenset(
    {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
)

CHAIN_JOB_NAME = "compute_chain_job"
RESUBMIT_JOB_NAME = "resubmit_outstanding_job"

chain_job = dg.define_asset_job(
    name=CHAIN_JOB_NAME,
    selection=dg.AssetSelection.groups(CHAIN_GROUP),
    description="Result manifest → verified snapshot → disjoint index → training → predictions "
    "→ output bundle, for one Compute job version.",
    executor_def=dg.in_process_executor,
)


def chain_run_config(job_id: str, version_id: str, allow_partial: bool = False) -> dict:
    """Run config that pins the chain to one exact result version of one Compute job."""
    return {
        "ops": {
            "result_manifest": {
                "config": {
                    "job_id": job_id,
                    "version_id": version_id,
                    "allow_partial": allow_partial,
                }
            }
        }
    }


class ResubmitConfig(dg.Config):
    """Which PARTIAL version's outstanding items to resubmit."""

    job_id: str
    from_version_id: str


def idempotency_key(job_id: str, version_id: str) -> str:
    """One resubmission per PARTIAL version, whoever asks and however often."""
    return f"resubmit:{job_id}:{version_id}"


TRANSIENT_RETRIES = 4
RETRY_BASE_SECONDS = 2.0


@dg.op(description="Resubmit the outstanding items of one PARTIAL result version to Compute.")
def resubmit_outstanding(
    context: dg.OpExecutionContext,
    config: ResubmitConfig,
    compute: ComputeResource,
    bundle_store: BundleStoreResource,
) -> dg.Output[int]:
    """Ask Compute to run only the outstanding items; the idempotency key makes retries safe.

    A transient Compute error asks Dagster to retry the op with a growing wait; the same
    idempotency key means a retry after a resubmission that did go through starts nothing new.
    """
    client = compute.client()
    try:
        manifest = bundle_store.store().read_manifest(
            client.manifest_url(config.job_id, config.from_version_id)
        )
        attempt = client.resubmit(
            config.job_id,
            from_version_id=config.from_version_id,
            idempotency_key=idempotency_key(config.job_id, config.from_version_id),
        )
    except ComputeUnavailable as e:
        wait = RETRY_BASE_SECONDS * 2**context.retry_number
        context.log.warning(f"Compute unavailable ({e}); retrying in {wait:.0f}s")
        raise dg.RetryRequested(max_retries=TRANSIENT_RETRIES, seconds_to_wait=wait) from e
    context.log.info(
        f"resubmitted {manifest.counts.outstanding} outstanding items of {config.job_id} "
        f"version {config.from_version_id} as attempt {attempt}"
    )
    return dg.Output(
        attempt,
        metadata={
            "job_id": config.job_id,
            "from_version_id": config.from_version_id,
            "attempt": attempt,
            "outstanding_resubmitted": manifest.counts.outstanding or 0,
        },
    )


@dg.job(name=RESUBMIT_JOB_NAME, executor_def=dg.in_process_executor)
def resubmit_job() -> None:
    """Resubmit outstanding items of a PARTIAL Compute job version."""
    resubmit_outstanding()


def resubmit_run_config(job_id: str, version_id: str) -> dict:
    """Run config for :data:`resubmit_job`."""
    return {
        "ops": {
            "resubmit_outstanding": {"config": {"job_id": job_id, "from_version_id": version_id}}
        }
    }
