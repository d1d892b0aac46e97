"""The Dagster jobs: the end-to-end chain over the asset group, and the resubmission job.

A resubmission is a job rather than a side effect of a sensor tick, so it is visible, logged and
retryable in the UI; its idempotency key makes a retry of the same request harmless.
"""

import functools

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,  # what define_asset_job returns; not exported by name
)

from assets import DEFAULT_CHAIN, chain_group
from assets.result_manifest import ResultManifestConfig
from pipeline.bundle.errors import BundleError
from pipeline.defs.run_labels import RUN_LABEL_HOOKS
from resources.compute.client import ComputeError, ComputeUnavailable
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource, source_client

#: Run statuses after which a run does nothing more.
FINISHED_RUN_STATUSES = frozenset(
    {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
)

CHAIN_JOB_NAME = "compute_chain_job"
RESUBMIT_JOB_NAME = "resubmit_outstanding_job"

#: How often the daemon retries a failed chain run (run retries are on in dagster.yaml), from
#: the failed step: what already succeeded is loaded from the failed run's artifacts.
CHAIN_RUN_RETRIES = 2


def chain_job_name(chain: str = DEFAULT_CHAIN) -> str:
    """The name of ``chain``'s job: ``<chain>_chain_job``, or today's name for the default."""
    return f"{chain}_chain_job" if chain else CHAIN_JOB_NAME


def is_chain_job(job_name: str) -> bool:
    """Whether ``job_name`` is a chain's job (of any chain)."""
    return job_name == CHAIN_JOB_NAME or job_name.endswith("_chain_job")


def chain_job_for(chain: str = DEFAULT_CHAIN) -> UnresolvedAssetJobDefinition:
    """The end-to-end job of ``chain``: its group, in one process, retried from the failure.
    One object per chain: its sensor, its schedule and the code location share it."""
    return _chain_job(chain)


@functools.cache
def _chain_job(chain: str) -> UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        name=chain_job_name(chain),
        selection=dg.AssetSelection.groups(chain_group(chain)),
        description="Result manifest → verified snapshot → disjoint index → training → "
        "predictions → output bundle, for one Compute job version"
        + (f" (chain {chain})." if chain else "."),
        executor_def=dg.in_process_executor,
        hooks=RUN_LABEL_HOOKS,
        tags={
            "dagster/max_retries": str(CHAIN_RUN_RETRIES),
            "dagster/retry_strategy": "FROM_FAILURE",
        },
    )


chain_job = chain_job_for()


def chain_runs(
    instance: dg.DagsterInstance, job_id: str, version_id: str, chain: str = DEFAULT_CHAIN
) -> list[dg.DagsterRun]:
    """Every run of ``chain`` recorded for one version of one job (by the sensor, schedule or
    hand)."""
    return instance.get_runs(
        filters=dg.RunsFilter(
            job_name=chain_job_name(chain),
            tags={"lithi/job_id": job_id, "lithi/version_id": version_id},
        )
    )


def chain_run_config(job_id: str, version_id: str, allow_partial: bool = False) -> dg.RunConfig:
    """Run config that pins the chain to one exact result version of one Compute job."""
    return dg.RunConfig(
        ops={
            "result_manifest": ResultManifestConfig(
                job_id=job_id, version_id=version_id, allow_partial=allow_partial
            )
        }
    )


class ResubmitConfig(dg.Config):
    """Which PARTIAL version's outstanding items to resubmit."""

    job_id: str
    from_version_id: str
    chain: str = ""  # the chain whose source holds the job (empty: the default chain)


def idempotency_key(job_id: str, version_id: str) -> str:
    """One resubmission per PARTIAL version, whoever asks and however often."""
    return f"resubmit:{job_id}:{version_id}"


#: A transient Compute error (unreachable, overloaded) is retried by Dagster with a growing wait:
#: 2, 4, 8, 16 s. The same idempotency key makes every retry harmless.
TRANSIENT_RETRY = dg.RetryPolicy(max_retries=4, delay=2, backoff=dg.Backoff.EXPONENTIAL)


@dg.op(
    description="Resubmit the outstanding items of one PARTIAL result version to Compute.",
    retry_policy=TRANSIENT_RETRY,
)
def resubmit_outstanding(
    context: dg.OpExecutionContext,
    config: ResubmitConfig,
    compute: ComputeResource,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
) -> dg.Output[int]:
    """Ask Compute to run only the outstanding items; the idempotency key makes retries safe.

    :class:`ComputeUnavailable` propagates, so Dagster retries the op (``TRANSIENT_RETRY``); a
    refusal (unknown job, a version that is not PARTIAL) or a bad bundle fails it for good.
    """
    client = source_client(compute, bundle_store, chain_settings.for_chain(config.chain))
    try:
        manifest = bundle_store.store().read_manifest(
            client.bundle_url(config.job_id, config.from_version_id)
        )
        attempt = client.resubmit(
            config.job_id,
            from_version_id=config.from_version_id,
            idempotency_key=idempotency_key(config.job_id, config.from_version_id),
        )
    except ComputeUnavailable as e:
        context.log.warning(f"Compute unavailable ({e}); Dagster retries this op")
        raise
    except (ComputeError, BundleError) as e:
        raise dg.Failure(f"{type(e).__name__}: {e}", allow_retries=False) from e
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


def resubmit_run_config(job_id: str, version_id: str, chain: str = "") -> dg.RunConfig:
    """Run config for :data:`resubmit_job`."""
    return dg.RunConfig(
        ops={
            "resubmit_outstanding": ResubmitConfig(
                job_id=job_id, from_version_id=version_id, chain=chain
            )
        }
    )
