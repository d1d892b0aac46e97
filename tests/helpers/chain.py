"""Shared set-up for chain tests: labelled sample jobs on a local Compute, resources, an instance.

Bundles never change once staged, so a healthy sample job labelled once per session
(:class:`LabelledSamples`) is shared read-only by every chain test; tests that inject faults or
resubmit submit jobs of their own with :func:`sample_job`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from assets.training_run import TrainingConfig
from pipeline.defs.definitions import build_definitions
from pipeline.defs.jobs import CHAIN_JOB_NAME, RESUBMIT_JOB_NAME, chain_run_config
from pipeline.defs.samples import submit_sample_job
from pipeline.defs.sensor import SENSOR_NAME
from resources.compute.faults import FaultSpec
from resources.dagster.artifacts import ArtifactStore
from resources.dagster.chain_settings import ChainSettings
from resources.dagster.clients import BundleStoreResource, ComputeResource
from resources.dagster.io_manager import ChainIOManager
from resources.settings import REPO_ROOT
from tests.helpers.timing import limit

#: The chain's edges: the versions Compute published feed the manifest read, each link feeds the
#: next, and the output bundle also names its training run.
CHAIN_EDGES = [
    ("compute_versions", "result_manifest"),
    ("result_manifest", "verified_snapshot"),
    ("verified_snapshot", "disjoint_index"),
    ("disjoint_index", "training_run"),
    ("training_run", "prediction_table"),
    ("prediction_table", "output_bundle"),
    ("training_run", "output_bundle"),
]

#: What chain tests train: the sample's numeric columns, chosen automatically (and recorded),
#: for a few epochs.
FAST_TRAINING = dg.RunConfig(ops={"training_run": TrainingConfig(epochs=3, auto_features=True)})


def chain_resources(
    home: Path, job_id: str, *, compute_root: Path | None = None, **settings: object
) -> dict[str, object]:
    """Resources for an in-process chain over ``home`` (inline Compute, no DataLoader workers,
    one torch thread as in the rest of the suite; a Ray launch waits for its ranks to be placed
    as long as the suite's other waits, since a busy machine places them slowly and placing is
    not what a test judges).

    ``compute_root`` points at a shared, already-labelled Compute (default ``home/compute``);
    the cache and artifacts are always the test's own. ``settings`` are :class:`ChainSettings`
    fields (the PARTIAL policy's among them).
    """
    # A shared Compute's results are every test's sources: the cache copies them rather than
    # link them, so a test that tampers with its cache changes no other test's input.
    store = BundleStoreResource(cache_dir=str(home / "cache"), link_local=compute_root is None)
    artifacts = ArtifactStore(root=str(home / "artifacts"))
    return {
        "compute": ComputeResource(root=str(compute_root or home / "compute"), executor="inline"),
        "bundle_store": store,
        "artifacts": artifacts,
        "chain_io_manager": ChainIOManager(artifacts=artifacts, bundle_store=store),
        "chain_settings": ChainSettings(
            job_id=job_id,
            **{
                "world_size": 1,
                "num_workers": 0,
                "torch_threads": 1,
                "ray_rank_wait_seconds": limit(300),
                **settings,
            },
        ),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
    }


def sample_job(home: Path, sample: str = "digits", faults: FaultSpec | None = None) -> str:
    """Stage a sample and run its labelling job inline under ``home``; return the job id."""
    job_id, _ = submit_sample_job(
        sample, home, faults or FaultSpec(), job_id=f"{sample}-t", executor="inline"
    )
    return job_id


@dataclass(frozen=True)
class LabelledSamples:
    """Healthy digits and wine jobs, labelled once: read-only for every test that uses them."""

    home: Path
    jobs: dict[str, str]

    @property
    def compute_root(self) -> Path:
        """The shared local Compute's root."""
        return self.home / "compute"

    def resources(self, home: Path, sample: str, **settings: object) -> dict[str, object]:
        """Chain resources over the shared Compute, with ``home`` for the cache and artifacts."""
        return chain_resources(home, self.jobs[sample], compute_root=self.compute_root, **settings)


def label_samples(home: Path) -> LabelledSamples:
    """Stage and label the digits and wine samples under ``home``."""
    return LabelledSamples(home, {s: sample_job(home, s) for s in ("digits", "wine")})


# -- a persisted instance holding a finished chain run (lineage tests) ----------------------

DAGSTER_YAML = """\
# A throwaway instance for the lineage tests: SQLite storage in this folder, no telemetry, and
# no "join the community" dialog over the UI the browser test looks at.
telemetry:
  enabled: false
nux:
  enabled: false
"""


@dataclass(frozen=True)
class LineageInstance:
    """Where the history lives: a PARTIAL version, its resubmission, two chain runs."""

    dagster_home: Path
    lithi_home: Path
    compute_root: Path
    job_id: str
    partial_version_id: str  # v1: PARTIAL, trained on its accepted parts (an older checkpoint)
    version_id: str  # v2: the resubmission's complete version, trained on last
    partial_run_id: str
    run_id: str
    workspace: Path

    def env(self) -> dict[str, str]:
        """Environment for a process (webserver, CLI) that should see this instance."""
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.dagster_home),
            "LITHI_HOME": str(self.lithi_home),
            "LITHI_COMPUTE_ROOT": str(self.compute_root),
            "LITHI_COMPUTE_EXECUTOR": "inline",
            "LITHI_JOB_ID": self.job_id,
        }

    def instance(self) -> dg.DagsterInstance:
        """Open the persisted instance (the caller disposes of it)."""
        return dg.DagsterInstance.from_config(str(self.dagster_home))


def write_workspace(path: Path) -> Path:
    """A workspace file loading the definitions with the repo root as working dir."""
    path.write_text(
        "load_from:\n"
        "  - python_module:\n"
        "      module_name: pipeline.defs.definitions\n"
        "      location_name: lithi-train\n"
        f"      working_directory: {REPO_ROOT}\n"
    )
    return path


def observations(result) -> list[dg.AssetObservation]:
    """The versions a sensor tick observed (its other events are check results)."""
    return [e for e in result.asset_events if isinstance(e, dg.AssetObservation)]


def sensor_tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None):
    """One evaluation of the sensor, storing what it observed as the daemon does."""
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources=defs.resources
    ) as ctx:
        result = sensor.evaluate_tick(ctx)
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result


def build_lineage_instance(root: Path) -> LineageInstance:
    """A history as the daemon would leave it, in a new persisted Dagster home.

    The wine job loses 30% of its items (v1, PARTIAL); the sensor observes v1; the chain is
    trained on v1's accepted parts (allowed by hand: an older checkpoint to find later); the
    resubmission publishes v2; the sensor observes v2 and its chain run trains on it.
    """
    dagster_home = root / "dagster_home"
    lithi_home = root / "lithi"
    dagster_home.mkdir(parents=True)
    lithi_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)

    job_id = sample_job(lithi_home, "wine", FaultSpec(lose_fraction=0.3))
    resources = chain_resources(lithi_home, job_id, base_delay_seconds=0)
    defs = build_definitions(**resources)
    chain = defs.resolve_job_def(CHAIN_JOB_NAME)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        first = sensor_tick(defs, instance, None)
        v1 = first.run_requests[0].tags["lithi/version_id"]
        config = chain_run_config(job_id, v1, allow_partial=True)
        config.ops.update(FAST_TRAINING.ops)
        partial = chain.execute_in_process(
            run_config=config, instance=instance, tags=_manual_tags(job_id, v1)
        )
        assert partial.success, f"the chain run on {v1} failed"
        (resubmit,) = first.run_requests
        assert (
            defs.resolve_job_def(RESUBMIT_JOB_NAME)
            .execute_in_process(
                run_config=resubmit.run_config, instance=instance, tags=resubmit.tags
            )
            .success
        )
        second = sensor_tick(defs, instance, first.cursor)
        (request,) = second.run_requests
        v2 = request.tags["lithi/version_id"]
        config = dg.RunConfig(ops={**request.run_config["ops"], **FAST_TRAINING.ops})
        result = chain.execute_in_process(run_config=config, instance=instance, tags=request.tags)
    assert result.success, f"the chain run {result.run_id} failed; nothing to inspect"
    workspace = write_workspace(root / "workspace.yaml")
    return LineageInstance(
        dagster_home,
        lithi_home,
        lithi_home / "compute",
        job_id,
        v1,
        v2,
        partial.run_id,
        result.run_id,
        workspace,
    )


def _manual_tags(job_id: str, version_id: str) -> dict[str, str]:
    """What a person launching the chain by hand for one version tags it with."""
    return {
        "lithi/job_id": job_id,
        "lithi/version_id": version_id,
        "lithi/trigger": "manual",
        "lithi/allow_partial": "true",
    }
