"""Dagster wrappers of the resources: thin, typed ``ConfigurableResource``s over the engines.

``pipeline.defs.definitions`` fills them from :class:`resources.settings.LithiEnv`; tests build
them pointing at temporary roots. Secrets never appear here: credential refs map to environment
variable NAMES, resolved at download time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from resources.bundle_store import BundleStore
from resources.compute.client import ComputeClient
from resources.compute.local import LocalCompute
from resources.credentials import CredentialRegistry


class ComputeResource(dg.ConfigurableResource):
    """The Compute service the chain submits to and watches (the local one here)."""

    root: str = Field(description="The local Compute's root directory (jobs, results).")
    executor: Literal["subprocess", "inline"] = Field(
        default="subprocess",
        description="'subprocess': each job attempt is a detached process; 'inline': in-process.",
    )
    credential_refs: dict[str, str] = Field(
        default_factory=dict,
        description="credential_ref -> NAME of the environment variable holding its secret.",
    )

    def client(self) -> ComputeClient:
        """A client of the configured Compute service (cheap; state is on disk, not in here)."""
        return LocalCompute(
            Path(self.root), self.executor, credentials=CredentialRegistry(self.credential_refs)
        )


class BundleStoreResource(dg.ConfigurableResource):
    """Where bundles are downloaded to: a content-addressed local cache over fsspec locations."""

    cache_dir: str = Field(description="The cache directory (objects, ledger, bundle views).")
    credential_refs: dict[str, str] = Field(
        default_factory=dict,
        description="credential_ref -> NAME of the environment variable holding its secret.",
    )

    def store(self) -> BundleStore:
        """The bundle store over the configured cache, with the registered credential refs."""
        return BundleStore(Path(self.cache_dir), CredentialRegistry(self.credential_refs))
