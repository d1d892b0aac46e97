"""Settings of the chain: which Compute job it follows, where artifacts go, the PARTIAL policy.

Every field has an embedded default and an environment variable that overrides it, so the demo
runs with no configuration and a deployment changes behaviour without a code change.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from resources.compute.client import ComputeClient

REPO_ROOT = Path(__file__).resolve().parents[1]


def lithi_home() -> Path:
    """Where the local Compute, the bundle cache and run artifacts live (``LITHI_HOME``)."""
    return Path(os.environ.get("LITHI_HOME") or REPO_ROOT / ".lithi").resolve()


class ChainSettings(dg.ConfigurableResource):
    """The Compute job(s) the chain follows and the sensor's PARTIAL policy."""

    job_id: str = ""  # empty means the most recently submitted Compute job
    watch_jobs: str = ""  # comma-separated job ids; empty means just ``job_id``
    max_attempts: int = 3
    base_delay_seconds: float = 5.0
    train_on_partial: bool = False
    max_resubmit_retries: int = 3  # new runs for a resubmission run that failed
    artifacts_dir: str = ""  # empty means LITHI_HOME/artifacts
    credential_ref: str = ""  # registered reference used to download result bundles, if any
    world_size: int = 1  # training ranks: 1 trains in the step's process, >1 through torchrun
    num_workers: int = 2  # DataLoader worker processes per rank

    @classmethod
    def from_env(cls) -> ChainSettings:
        """Build from ``LITHI_*`` environment variables, falling back to the embedded defaults."""
        env = os.environ
        return cls(
            job_id=env.get("LITHI_JOB_ID", ""),
            watch_jobs=env.get("LITHI_WATCH_JOBS", ""),
            max_attempts=int(env.get("LITHI_MAX_ATTEMPTS", "3")),
            base_delay_seconds=float(env.get("LITHI_RESUBMIT_DELAY_SECONDS", "5")),
            train_on_partial=env.get("LITHI_TRAIN_ON_PARTIAL", "").lower() in ("1", "true", "yes"),
            max_resubmit_retries=int(env.get("LITHI_MAX_RESUBMIT_RETRIES", "3")),
            artifacts_dir=env.get("LITHI_ARTIFACTS_DIR", ""),
            credential_ref=env.get("LITHI_CREDENTIAL_REF", ""),
            world_size=int(env.get("LITHI_WORLD_SIZE", "1")),
            num_workers=int(env.get("LITHI_NUM_WORKERS", "2")),
        )

    def resolve_job(self, client: ComputeClient) -> str | None:
        """The job the chain follows: ``job_id``, else the most recently submitted one."""
        return self.job_id or client.latest_job()

    def watched_jobs(self, client: ComputeClient) -> list[str]:
        """The job ids the sensor watches: ``watch_jobs``, else the job the chain follows."""
        ids = [j.strip() for j in self.watch_jobs.split(",") if j.strip()]
        if ids:
            return ids
        job = self.resolve_job(client)
        return [job] if job else []

    def artifacts(self) -> Path:
        """Root for run artifacts: index files, checkpoints, records, predictions, bundles."""
        return (
            Path(self.artifacts_dir).resolve() if self.artifacts_dir else lithi_home() / "artifacts"
        )
