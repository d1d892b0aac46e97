"""Shared set-up for chain tests: a sample job on a local Compute, and resources pointing at it."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from pipeline.defs.demo import submit_sample_job
from resources.compute.faults import FaultSpec
from resources.dagster_resources import BundleStoreResource, ComputeResource
from resources.settings import ChainSettings


def chain_resources(home: Path, job_id: str, **settings: object) -> dict[str, object]:
    """Resources for an in-process chain over ``home`` (inline Compute, no DataLoader workers)."""
    return {
        "compute": ComputeResource(root=str(home / "compute"), executor="inline"),
        "bundle_store": BundleStoreResource(cache_dir=str(home / "cache")),
        "chain_settings": ChainSettings(
            job_id=job_id,
            artifacts_dir=str(home / "artifacts"),
            **{"world_size": 1, "num_workers": 0, **settings},
        ),
        "pipes_subprocess_client": dg.PipesSubprocessClient(),
    }


def sample_job(home: Path, sample: str = "digits", faults: FaultSpec | None = None) -> str:
    """Stage a sample and run its labelling job inline; return the job id."""
    job_id, _ = submit_sample_job(
        sample, home, faults or FaultSpec(), job_id=f"{sample}-t", executor="inline"
    )
    return job_id


FAST_TRAINING = {"ops": {"training_run": {"config": {"epochs": 3}}}}
