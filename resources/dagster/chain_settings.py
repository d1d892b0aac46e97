"""``ChainSettings``: the Dagster resource the assets and the sensor read their settings from.

Built from one :class:`~resources.settings.LithiEnv` (:meth:`ChainSettings.from_env`); its
fields are flat Dagster config, and the PARTIAL policy is made from them as plain data.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from resources.compute.client import ComputeClient
from resources.settings import LithiEnv, NonNegativeInt, Policy, PositiveInt, Seconds


class ChainSettings(dg.ConfigurableResource):
    """The Compute job(s) the chain follows, how it trains, and the sensor's PARTIAL policy."""

    job_id: str = ""  # empty means the most recently submitted Compute job
    watch_jobs: str = ""  # comma-separated job ids; empty means just ``job_id``
    # the PARTIAL policy's fields, flat (Dagster config holds no plain pydantic model)
    max_attempts: PositiveInt = 3
    base_delay_seconds: Seconds = 5.0
    backoff: float = Field(default=2.0, ge=1, allow_inf_nan=False)
    train_on_partial: bool = False
    max_resubmit_retries: NonNegativeInt = 3
    credential_ref: str = ""  # registered reference used to download result bundles, if any
    world_size: PositiveInt = 1  # training ranks: 1 trains in the step's process, >1 torchrun
    num_workers: NonNegativeInt = 2  # DataLoader worker processes per rank
    checkpoint_every: NonNegativeInt = 200  # optimizer steps between mid-fit cuts; 0 never
    torchrun_max_restarts: NonNegativeInt = 1  # torchrun restarts every rank when one dies
    device: str = "auto"  # auto (cuda:LOCAL_RANK if CUDA is available, else cpu), cpu, cuda[:N]
    # where each output bundle is also published, as <publish_url>/<version_id>/ (empty: not)
    publish_url: str = ""
    publish_credential_ref: str = ""  # registered reference used to write there, if any

    @classmethod
    def from_env(cls, env: LithiEnv) -> ChainSettings:
        """The settings ``env`` describes."""
        return cls(
            job_id=env.job_id,
            watch_jobs=env.watch_jobs,
            max_attempts=env.max_attempts,
            base_delay_seconds=env.resubmit_delay_seconds,
            train_on_partial=env.train_on_partial,
            max_resubmit_retries=env.max_resubmit_retries,
            credential_ref=env.credential_ref,
            world_size=env.world_size,
            num_workers=env.num_workers,
            checkpoint_every=env.checkpoint_every,
            torchrun_max_restarts=env.torchrun_max_restarts,
            device=env.device,
            publish_url=env.publish_url,
            publish_credential_ref=env.publish_credential_ref,
        )

    @property
    def policy(self) -> Policy:
        """The sensor's PARTIAL policy (checked: a bad combination is refused here)."""
        return Policy(
            max_attempts=self.max_attempts,
            base_delay_seconds=self.base_delay_seconds,
            backoff=self.backoff,
            train_on_partial=self.train_on_partial,
            max_resubmit_retries=self.max_resubmit_retries,
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
