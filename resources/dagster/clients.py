"""Dagster wrappers of the resources: thin, typed ``ConfigurableResource``s over the engines.

``pipeline.defs.definitions`` fills them from :class:`resources.settings.LithiEnv`; tests build
them pointing at temporary roots. Secrets never appear here: credential refs map to environment
variable NAMES, resolved at download time.
"""

from __future__ import annotations

import inspect
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import dagster as dg
from pydantic import Field

from resources.bundle_store import BundleStore
from resources.compute.bundle_dir import BundleDirectory
from resources.compute.client import ComputeClient, ComputeError
from resources.compute.local import LocalCompute
from resources.credentials import CredentialRegistry

if TYPE_CHECKING:
    from resources.dagster.chain_settings import ChainSettings


class ComputeResource(dg.ConfigurableResource):
    """The Compute service the chain watches (and asks to resubmit, where it can): the local one,
    or yours (docs/compute-client.md)."""

    service: str = Field(
        default="local",
        description="'local', or the import path of your ComputeClient ('pkg.module:Class').",
    )
    root: str = Field(default="", description="The local Compute's root (jobs, results).")
    executor: Literal["subprocess", "inline"] = Field(
        default="subprocess",
        description="'subprocess': each job attempt is a detached process; 'inline': in-process.",
    )
    credential_refs: dict[str, str] = Field(
        default_factory=dict,
        description="credential_ref -> NAME of the environment variable holding its secret.",
    )

    def client(self) -> ComputeClient:
        """A client of the configured Compute service (cheap; state lives with the service)."""
        if self.service != "local":
            return load_client(self.service)
        if not self.root:
            raise ComputeError("the local Compute needs a root directory (LITHI_COMPUTE_ROOT)")
        return LocalCompute(
            Path(self.root), self.executor, credentials=CredentialRegistry(self.credential_refs)
        )


def load_client(path: str) -> ComputeClient:
    """Construct the :class:`ComputeClient` subclass at ``package.module:Class`` (no arguments)."""
    module_name, sep, attr = path.partition(":")
    try:
        cls = pkgutil.resolve_name(path) if sep and module_name and attr else None
    except ImportError as e:
        raise ComputeError(f"Compute client {path!r}: cannot import {module_name!r} ({e})") from e
    except AttributeError:
        cls = None
    if not (inspect.isclass(cls) and issubclass(cls, ComputeClient)):
        raise ComputeError(
            f"Compute client {path!r}: expected 'package.module:Class' naming a subclass of "
            "resources.compute.client.ComputeClient"
        )
    return cls()


class BundleStoreResource(dg.ConfigurableResource):
    """Where bundles are downloaded to: a content-addressed local cache over fsspec locations."""

    cache_dir: str = Field(description="The cache directory (objects, ledger, bundle views).")
    credential_refs: dict[str, str] = Field(
        default_factory=dict,
        description="credential_ref -> NAME of the environment variable holding its secret.",
    )
    rehash: bool = Field(
        default=False,
        description="Trust no cache ledger: hash every cached file again before using it.",
    )
    link_local: bool = Field(
        default=True,
        description=(
            "Hard-link a local bundle's read-only files into the cache (on the cache's file "
            "system) instead of copying them: no bytes written. A source edited in place "
            "afterwards is refused, not read. False: copy every file."
        ),
    )

    def store(self) -> BundleStore:
        """The bundle store over the configured cache, with the registered credential refs."""
        return BundleStore(
            Path(self.cache_dir),
            CredentialRegistry(self.credential_refs),
            rehash=self.rehash,
            link=self.link_local,
        )


class BundleSourceResource(ComputeResource):
    """A result bundle at a URL and its newer versions beside it, with no Compute behind it."""

    bundle_url: str = Field(description="URL (or path) of the bundle to train on.")
    bundle_store: BundleStoreResource
    credential_ref: str = Field(default="", description="Reference used to read the URL.")

    def client(self) -> ComputeClient:
        """The bundle's lineage as a read-only job (see :mod:`resources.compute.bundle_dir`)."""
        return BundleDirectory(
            self.bundle_url, self.bundle_store.store(), self.credential_ref or None
        )


def source_client(
    compute: ComputeResource, bundle_store: BundleStoreResource, settings: ChainSettings
) -> ComputeClient:
    """The client of one chain's source: the lineage of its bundle URL where it names one (a
    named chain's ``bundle_url``), else the code location's Compute service."""
    if settings.bundle_url:
        return BundleDirectory(
            settings.bundle_url, bundle_store.store(), settings.credential_ref or None
        )
    return compute.client()
