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
from pipeline.defs.demo import submit_sample_job
from pipeline.defs.jobs import CHAIN_JOB_NAME, chain_run_config
from resources.artifacts import ArtifactStore
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.dagster_resources import BundleStoreResource, ComputeResource
from resources.io_manager import ChainIOManager
from resources.settings import REPO_ROOT, ChainSettings, Policy

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
    """Resources for an in-process chain over ``home`` (inline Compute, no DataLoader workers).

    ``compute_root`` points at a shared, already-labelled Compute (default ``home/compute``);
    the cache and artifacts are always the test's own. ``settings`` are :class:`ChainSettings`
    fields or :class:`Policy` fields.
    """
    policy = {k: settings.pop(k) for k in list(settings) if k in Policy.model_fields}
    store = BundleStoreResource(cache_dir=str(home / "cache"))
    artifacts = ArtifactStore(root=str(home / "artifacts"))
    return {
        "compute": ComputeResource(root=str(compute_root or home / "compute"), executor="inline"),
        "bundle_store": store,
        "artifacts": artifacts,
        "chain_io_manager": ChainIOManager(artifacts=artifacts, bundle_store=store),
        "chain_settings": ChainSettings(
            job_id=job_id,
            policy=Policy(**policy),
            **{"world_size": 1, "num_workers": 0, **settings},
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
    """Where the finished chain run lives and what it was built from."""

    dagster_home: Path
    lithi_home: Path
    compute_root: Path
    job_id: str
    version_id: str
    run_id: str
    workspace: Path

    def env(self) -> dict[str, str]:
        """Environment for a process (webserver, CLI) that should see this instance."""
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.dagster_home),
            "LITHI_HOME": str(self.lithi_home),
            "LITHI_COMPUTE_ROOT": str(self.compute_root),
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


def build_lineage_instance(root: Path, samples: LabelledSamples) -> LineageInstance:
    """Run the chain job over the shared digits job into a new persisted Dagster home."""
    dagster_home = root / "dagster_home"
    lithi_home = root / "lithi"
    dagster_home.mkdir(parents=True)
    lithi_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)

    job_id = samples.jobs["digits"]
    status = LocalCompute(samples.compute_root).status(job_id)
    version_id = status.latest_version_id
    assert version_id, f"Compute job {job_id} ended {status.state} without a result"

    run_config = chain_run_config(job_id, version_id)
    run_config.ops.update(FAST_TRAINING.ops)
    # The tags the sensor puts on a rebuild from a newer manifest (pipeline.defs.sensor._tags).
    tags = {
        "lithi/job_id": job_id,
        "lithi/version_id": version_id,
        "lithi/attempt": "1",
        "lithi/trigger": "newer_manifest",
        "lithi/allow_partial": "false",
    }
    defs = build_definitions(**samples.resources(lithi_home, "digits"))
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        result = defs.resolve_job_def(CHAIN_JOB_NAME).execute_in_process(
            run_config=run_config, instance=instance, tags=tags
        )
    assert result.success, f"the chain run {result.run_id} failed; nothing to inspect"
    workspace = write_workspace(root / "workspace.yaml")
    return LineageInstance(
        dagster_home,
        lithi_home,
        samples.compute_root,
        job_id,
        version_id,
        result.run_id,
        workspace,
    )
