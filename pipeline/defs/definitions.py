"""The one ``Definitions`` that ``workspace.yaml`` loads: assets, checks, jobs, schedule, sensor.

Every setting comes from one :class:`~resources.settings.LithiEnv` (``LITHI_*`` variables with
embedded defaults: local Compute, a bundle cache and artifacts under ``LITHI_HOME``); a bad value
stops the code location from loading with one line naming the variable.
"""

import dagster as dg

from assets import CHAIN_ASSETS, CHAIN_CHECKS
from pipeline.defs.jobs import chain_job, resubmit_job
from pipeline.defs.sensor import compute_partial_sensor
from resources.artifacts import ArtifactStore
from resources.dagster_resources import BundleStoreResource, ComputeResource
from resources.io_manager import ChainIOManager
from resources.settings import ChainSettings, LithiEnv, SettingsError


def resources_from(env: LithiEnv) -> dict[str, object]:
    """The resources ``env`` describes, keyed as the assets, jobs and sensor ask for them."""
    refs = env.credential_ref_map
    store = BundleStoreResource(cache_dir=str(env.cache_path), credential_refs=refs)
    artifacts = ArtifactStore(root=str(env.artifacts_path))
    return {
        "compute": ComputeResource(
            root=str(env.compute_root_path), executor=env.compute_executor, credential_refs=refs
        ),
        "bundle_store": store,
        "artifacts": artifacts,
        "chain_io_manager": ChainIOManager(artifacts=artifacts, bundle_store=store),
        "chain_settings": ChainSettings.from_env(env),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
    }


def chain_schedule(cron: str) -> dg.ScheduleDefinition:
    """The nightly (by default) rebuild of the chain, on ``cron`` in UTC."""
    try:
        return dg.ScheduleDefinition(
            name="compute_chain_schedule",
            job=chain_job,
            cron_schedule=cron,
            execution_timezone="UTC",
            description="Rebuild the chain from the configured job's latest complete manifest.",
        )
    except dg.DagsterInvalidDefinitionError as e:
        raise SettingsError(f"LITHI_CHAIN_CRON={cron!r}: not a cron schedule ({e})") from None


def build_definitions(env: LithiEnv | None = None, **resource_overrides: object) -> dg.Definitions:
    """Assemble the code location from ``env`` (default: the environment); tests override."""
    env = env or LithiEnv.load()
    return dg.Definitions(
        assets=CHAIN_ASSETS,
        asset_checks=CHAIN_CHECKS,
        jobs=[chain_job, resubmit_job],
        schedules=[chain_schedule(env.chain_cron)],
        sensors=[compute_partial_sensor],
        resources={**resources_from(env), **resource_overrides},
    )


defs = build_definitions()
