"""The one ``Definitions`` that ``workspace.yaml`` loads: assets, checks, jobs, schedule, sensor.

Every setting comes from one :class:`~resources.settings.LithiEnv` (``LITHI_*`` variables with
embedded defaults: local Compute, a bundle cache and artifacts under ``LITHI_HOME``); a bad value
stops the code location from loading with one line naming the variable.
"""

import dagster as dg

from assets import CHAIN_CHECKS, chain_assets
from pipeline.defs.jobs import chain_job, resubmit_job
from pipeline.defs.schedule import chain_schedule
from pipeline.defs.sensor import compute_partial_sensor
from pipeline.training.trainer import TrainerError, load_trainer
from resources.dagster.artifacts import ArtifactStore
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import (
    BundleSourceResource,
    BundleStoreResource,
    ComputeResource,
)
from resources.dagster.io_manager import ChainIOManager
from resources.settings import LithiEnv, SettingsError


def resources_from(env: LithiEnv) -> dict[str, object]:
    """The resources ``env`` describes, keyed as the assets, jobs and sensor ask for them."""
    refs = env.credential_ref_map
    store = BundleStoreResource(
        cache_dir=str(env.cache_path), credential_refs=refs, rehash=env.rehash
    )
    artifacts = ArtifactStore(root=str(env.artifacts_path))
    compute: ComputeResource
    if env.bundle_url:
        compute = BundleSourceResource(
            bundle_url=env.bundle_url, bundle_store=store, credential_ref=env.credential_ref
        )
    else:
        compute = ComputeResource(
            service=env.compute,
            root=str(env.compute_root_path),
            executor=env.compute_executor,
            credential_refs=refs,
        )
    return {
        "compute": compute,
        "bundle_store": store,
        "artifacts": artifacts,
        "chain_io_manager": ChainIOManager(artifacts=artifacts, bundle_store=store),
        "chain_settings": ChainSettings.from_env(env),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
    }


def build_definitions(env: LithiEnv | None = None, **resource_overrides: object) -> dg.Definitions:
    """Assemble the code location from ``env`` (default: the environment); tests override."""
    env = env or LithiEnv.load()
    try:
        load_trainer(env.trainer)
    except TrainerError as e:
        raise SettingsError(f"LITHI_TRAINER={env.trainer!r}: {e}") from None
    try:
        assets = chain_assets(env.trainer, env.trainer_defaults)
    except TrainerError as e:
        raise SettingsError(f"LITHI_TRAINER_CONFIG={env.trainer_config!r}: {e}") from None
    return dg.Definitions(
        assets=assets,
        asset_checks=CHAIN_CHECKS,
        jobs=[chain_job, resubmit_job],
        schedules=[chain_schedule(env.chain_cron)],
        sensors=[compute_partial_sensor],
        resources={**resources_from(env), **resource_overrides},
        # A linear chain gains nothing from a process per step, and pays a fresh interpreter
        # (torch, Dagster) for each: every job, the CLI's implicit one too, runs in-process.
        executor=dg.in_process_executor,
    )


def _load() -> dg.Definitions:
    try:
        return build_definitions()
    except SettingsError as e:
        # A bad setting is the user's to fix, not a bug: its one line, no traceback. SystemExit
        # stops whatever is loading the location (a code server, `dagster definitions
        # validate`) with that line on stderr and exit status 1.
        raise SystemExit(f"lithi-train: {e}") from None


defs = _load()
