"""``ChainSettings``: the Dagster resource the assets and the sensor read their settings from.

Built from one :class:`~resources.settings.LithiEnv` (:meth:`ChainSettings.from_env`); its
fields are flat Dagster config, and the PARTIAL policy is made from them as plain data.
"""

from __future__ import annotations

from typing import Literal

import dagster as dg
from pydantic import Field

from resources.compute.client import ComputeClient
from resources.settings import (
    LithiEnv,
    NonNegativeFloat,
    NonNegativeInt,
    Policy,
    PositiveFloat,
    PositiveInt,
    Seconds,
)


class ChainSource(dg.Config):
    """What one named chain reads and where it publishes; the settings not named here are the
    code location's (:class:`ChainSettings`)."""

    job_id: str = ""  # the Compute job it follows (empty: the most recently submitted one)
    watch_jobs: str = ""  # comma-separated job ids; empty means just ``job_id``
    bundle_url: str = ""  # a bundle and its newer versions beside it, with no Compute behind
    credential_ref: str = ""  # registered reference used to download its bundles, if any
    publish_url: str = ""
    publish_credential_ref: str = ""


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
    # torch's intra-op threads per rank; 0: the rank's share of the cores it may use
    torch_threads: NonNegativeInt = 0
    torchrun_max_restarts: NonNegativeInt = 1  # torchrun restarts every rank when one dies
    # with world_size > 1: torchrun on this machine, or ranks on the Ray cluster at RAY_ADDRESS
    launcher: Literal["torchrun", "ray"] = "torchrun"
    # the URL every Ray node and this step reach: inputs, cuts, checkpoints pass through it
    ray_artifacts_url: str = ""
    ray_credential_ref: str = ""  # registered reference used there, if any
    ray_python: str = "python"  # the interpreter the Ray job's entry point runs with
    ray_max_restarts: NonNegativeInt = 2  # attempts after a lost node, on the nodes left
    ray_worker_cpus: PositiveFloat = 1.0  # Ray resources per rank
    ray_worker_gpus: NonNegativeFloat = 0.0
    # the Ray job stops once this step has not beaten for this long (it is gone)
    ray_tether_seconds: PositiveFloat = 60.0
    # how long the Ray job waits for the cluster to place each rank (a busy cluster is slower)
    ray_rank_wait_seconds: PositiveFloat = 60.0
    device: str = "auto"  # auto (cuda:LOCAL_RANK if CUDA is available, else cpu), cpu, cuda[:N]
    # where each output bundle is also published, as <publish_url>/<version_id>/ (empty: not)
    publish_url: str = ""
    publish_credential_ref: str = ""  # registered reference used to write there, if any
    # the default chain reads a bundle URL through its compute resource; a named chain, here
    bundle_url: str = ""
    # the named chains of the code location, each with its own source (the default one has no
    # name and reads the fields above)
    chains: dict[str, ChainSource] = Field(default_factory=dict)

    @classmethod
    def from_env(cls, env: LithiEnv, chains: dict[str, ChainSource] | None = None) -> ChainSettings:
        """The settings ``env`` describes: each field from the variable of its name, and
        ``base_delay_seconds`` from ``LITHI_RESUBMIT_DELAY_SECONDS`` (``backoff`` has none);
        with the named ``chains`` of a chains file, each one's source and publishing."""
        shared = set(cls.model_fields) - {"chains", "bundle_url"}
        named = {f: getattr(env, f) for f in shared if f in LithiEnv.model_fields}
        return cls(**named, base_delay_seconds=env.resubmit_delay_seconds, chains=chains or {})

    @property
    def policy(self) -> Policy:
        """The sensor's PARTIAL policy, from the fields of the same names (checked: a bad
        combination is refused here)."""
        return Policy(**{f: getattr(self, f) for f in Policy.model_fields})

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

    def for_chain(self, name: str) -> ChainSettings:
        """The settings of chain ``name``: its own source and publishing, the rest shared;
        the default chain (no name) reads these settings as they are."""
        if not name:
            return self
        if name not in self.chains:
            raise KeyError(f"no chain named {name!r} in this code location (known: "
                           f"{', '.join(sorted(self.chains)) or 'none'})")  # fmt: skip
        shared = {f: getattr(self, f) for f in type(self).model_fields if f != "chains"}
        return type(self)(**{**shared, **self.chains[name].model_dump()})
