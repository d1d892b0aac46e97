"""The Dagster jobs: the end-to-end chain over the asset group, and the resubmission job.

A resubmission is a job rather than a side effect of a sensor tick, so it is visible, logged and
retryable in the UI; its idempotency key makes a retry of the same request harmless.
"""

import dagster as dg

from resources.dagster_resources import ComputeResource

CHAIN_GROUP = "compute_chain"
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


@dg.op(description="Resubmit the outstanding items of one PARTIAL result version to Compute.")
def resubmit_outstanding(
    context: dg.OpExecutionContext, config: ResubmitConfig, compute: ComputeResource
) -> dg.Output[int]:
    """Ask Compute to run only the outstanding items; the idempotency key makes retries safe."""
    client = compute.client()
    attempt = client.resubmit(
        config.job_id,
        from_version_id=config.from_version_id,
        idempotency_key=idempotency_key(config.job_id, config.from_version_id),
    )
    status = client.status(config.job_id)
    context.log.info(
        f"resubmitted the outstanding items of {config.job_id} version {config.from_version_id} "
        f"as attempt {attempt}"
    )
    return dg.Output(
        attempt,
        metadata={
            "job_id": config.job_id,
            "from_version_id": config.from_version_id,
            "attempt": attempt,
            "outstanding_resubmitted": status.outstanding,
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
