"""The one ``Definitions`` that ``workspace.yaml`` loads: assets, checks, jobs, schedule, sensor.

Every setting comes from one :class:`~resources.settings.LithiEnv` (``LITHI_*`` variables with
embedded defaults: local Compute, a bundle cache and artifacts under ``LITHI_HOME``); a bad value
stops the code location from loading with one line naming the variable.
"""

import warnings
from typing import NamedTuple

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,  # what define_asset_job returns; not exported by name
)

from assets import chain_assets, chain_checks
from pipeline.defs.chains_file import (
    ChainsFile,
    DefaultChainDecl,
    load_chains_file,
)
from pipeline.defs.jobs import chain_job_for, resubmit_job
from pipeline.defs.schedule import chain_schedule
from pipeline.defs.sensor import partial_sensor
from pipeline.training.trainer import TrainerError, load_trainer
from resources.dagster.artifacts import ArtifactStore
from resources.dagster.chain_settings import ChainSettings, ChainSource
from resources.dagster.clients import (
    BundleSourceResource,
    BundleStoreResource,
    ComputeResource,
)
from resources.dagster.io_manager import ChainIOManager
from resources.settings import LithiEnv, SettingsError


class ChainParts(NamedTuple):
    """Everything one chain adds to the code location."""

    assets: list
    checks: list
    job: UnresolvedAssetJobDefinition
    sensor: dg.SensorDefinition
    schedule: dg.ScheduleDefinition


def chain_parts(chain: str, trainer: str | None, defaults: dict | None, cron: str) -> ChainParts:
    """The chain factory: the six links of ``chain`` (trained by ``trainer`` with its config
    ``defaults``), their checks, its job, its sensor and its schedule."""
    return ChainParts(
        assets=chain_assets(trainer, defaults, chain),
        checks=chain_checks(chain),
        job=chain_job_for(chain),
        sensor=partial_sensor(chain),
        schedule=chain_schedule(cron, chain),
    )


def resources_from(env: LithiEnv, declared: ChainsFile | None = None) -> dict[str, object]:
    """The resources ``env`` (and the chains file, if any) describe, keyed as the assets, jobs
    and sensors ask for them."""
    refs = env.credential_ref_map
    store = BundleStoreResource(
        cache_dir=str(env.cache_path),
        credential_refs=refs,
        rehash=env.rehash,
        link_local=env.link_local,
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
        "chain_settings": ChainSettings.from_env(env, chain_sources(declared)),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
    }


def chain_sources(declared: ChainsFile | None) -> dict[str, ChainSource]:
    """Each declared chain's source and publishing, as the chain settings resource holds them."""
    return {
        c.name: ChainSource(
            job_id=c.source.job_id,
            watch_jobs=",".join(c.source.watch_jobs),
            bundle_url=c.source.bundle_url,
            credential_ref=c.source.credential_ref,
            publish_url=c.publish_url,
            publish_credential_ref=c.publish_credential_ref,
        )
        for c in (declared.chains if declared is not None else [])
    }


def build_definitions(env: LithiEnv | None = None, **resource_overrides: object) -> dg.Definitions:
    """Assemble the code location from ``env`` (default: the environment); tests override.

    The default chain comes from the ``LITHI_*`` variables (its trainer and config from the
    chains file where it declares them); ``LITHI_CHAINS`` adds the chains its YAML file
    declares, each with its own keys, group, job, sensor and schedule.
    """
    env = env or LithiEnv.load()
    declared = load_chains_file(env.chains) if env.chains else None
    parts: list[ChainParts] = []
    if declared is not None and isinstance(declared.default_chain, DefaultChainDecl):
        # declared in the file: its trainer and config, checked as the file was read
        default = declared.default_chain
        parts.append(chain_parts("", default.trainer, default.config, env.chain_cron))
    elif declared is None or declared.default_chain:
        try:
            load_trainer(env.trainer)
        except TrainerError as e:
            raise SettingsError(f"LITHI_TRAINER={env.trainer!r}: {e}") from None
        try:
            parts.append(chain_parts("", env.trainer, env.trainer_defaults, env.chain_cron))
        except TrainerError as e:
            raise SettingsError(f"LITHI_TRAINER_CONFIG={env.trainer_config!r}: {e}") from None
    if declared is not None:
        parts += [
            chain_parts(c.name, c.trainer, c.config, c.cron or env.chain_cron)
            for c in declared.chains
        ]
    resources = resources_from(env, declared)
    defs = dg.Definitions(
        assets=[a for p in parts for a in p.assets],
        asset_checks=[c for p in parts for c in p.checks],
        jobs=[*(p.job for p in parts), resubmit_job],
        schedules=[p.schedule for p in parts],
        sensors=[p.sensor for p in parts],
        resources={**resources, **resource_overrides},
        # A linear chain gains nothing from a process per step, and pays a fresh interpreter
        # (torch, Dagster) for each: every job, the CLI's implicit one too, runs in-process.
        executor=dg.in_process_executor,
    )
    with warnings.catch_warnings():
        # Resolving a sensor's jobs copies the sensor with ``owners=[]``, which Dagster 1.13
        # then warns is a beta parameter we never set. Resolved here once (the repository is
        # cached on ``defs``), a code server loading the location says nothing.
        warnings.filterwarnings("ignore", message="Parameter `owners`", category=dg.BetaWarning)
        defs.get_repository_def()
    return defs


def _load() -> dg.Definitions:
    try:
        return build_definitions()
    except SettingsError as e:
        # A bad setting is the user's to fix, not a bug: its one line, no traceback. SystemExit
        # stops whatever is loading the location (a code server, `dagster definitions
        # validate`) with that line on stderr and exit status 1.
        raise SystemExit(f"lithi-train: {e}") from None


defs = _load()
