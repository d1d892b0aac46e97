"""``model_is_current``: is a chain's model trained on the newest complete version of its source?

Dagster's staleness says an asset's inputs changed; it does not say, on the model's own page,
that the data it was trained on is no longer the newest. This check does: it fails (a warning,
the model is still usable) while the source has a complete version the model was not trained
on, naming both versions. It runs after each ``training_run`` in a chain run, by hand from the
asset's *Checks* tab, and is reported by the chain's sensor whenever what it would say changes
(a new complete version lands, or a new model is trained).
"""

import dagster as dg

from assets.chain_keys import chain_of
from assets.training_run import training_run
from resources.compute.client import ComputeError, ComputeUnavailable
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource, source_client

CHECK = "model_is_current"


def model_version(instance: dg.DagsterInstance, key: dg.AssetKey) -> str | None:
    """The version the latest materialization of ``training_run`` at ``key`` trained on."""
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    value = event.asset_materialization.metadata.get("snapshot/version_id")
    return None if value is None else str(getattr(value, "value", value))


def currency(model: str | None, latest_complete: dict[str, str]) -> tuple[bool, str]:
    """Whether a model trained on ``model`` is current, given each watched job's latest complete
    version, and one sentence saying why."""
    newest = ", ".join(f"{v} ({job})" for job, v in sorted(latest_complete.items())) or "none"
    if model is None:
        return False, f"no model is trained yet; the newest complete version is {newest}"
    if not latest_complete:
        return True, f"trained on {model}; no watched job has a complete version to compare"
    if model in latest_complete.values():
        return True, f"trained on {model}, the newest complete version of its job"
    return False, f"trained on {model}, but the newest complete version is {newest}"


def evaluation(
    key: dg.AssetKey, model: str | None, latest_complete: dict[str, str]
) -> dg.AssetCheckEvaluation:
    """The check's result as an event the sensor reports (no run needed)."""
    passed, said = currency(model, latest_complete)
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name=CHECK,
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=said,
        metadata=_metadata(model, latest_complete),
    )


def _metadata(model: str | None, latest_complete: dict[str, str]) -> dict[str, str]:
    return {
        "trained_on": model or "none",
        "newest_complete": ", ".join(f"{j}: {v}" for j, v in sorted(latest_complete.items()))
        or "none",
    }


def latest_complete_versions(client, jobs: list[str]) -> dict[str, str]:
    """Each job's latest version, for the jobs whose latest attempt is complete."""
    out = {}
    for job in jobs:
        status = client.status(job)
        if status.state == "SUCCEEDED" and status.latest_version_id:
            out[job] = status.latest_version_id
    return out


@dg.asset_check(
    asset=training_run,
    name=CHECK,
    description="The model is trained on the newest complete version of the chain's source "
    "(a warning while a newer complete version waits to be trained).",
)
def model_is_current(
    context: dg.AssetCheckExecutionContext,
    compute: ComputeResource,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
) -> dg.AssetCheckResult:
    """Compare the version the latest model trained on with Compute's latest complete ones."""
    key = context.check_specs[0].asset_key
    settings = chain_settings.for_chain(chain_of(key))
    try:
        client = source_client(compute, bundle_store, settings)
        latest = latest_complete_versions(client, settings.watched_jobs(client))
    except (ComputeError, ComputeUnavailable) as e:
        raise dg.Failure(f"Compute could not say which version is newest: {e}") from None
    model = model_version(context.instance, key)
    passed, said = currency(model, latest)
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=said,
        metadata=_metadata(model, latest),
    )
