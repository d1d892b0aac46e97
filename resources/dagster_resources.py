"""Dagster wrappers of the resources: thin, typed ``ConfigurableResource``s over the engines.

Each field has an embedded default and can be filled from the environment with ``dg.EnvVar``
(see :func:`default_resources`), so the demo needs no configuration and a deployment changes
where Compute and the cache live without a code change. Secrets never appear here: credential
refs map to environment variable NAMES, resolved at download time.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from resources.bundle_store import BundleStore
from resources.compute.client import ComputeClient
from resources.compute.local import LocalCompute
from resources.credentials import CredentialRegistry

ENV_HOME = "LITHI_HOME"
ENV_COMPUTE_ROOT = "LITHI_COMPUTE_ROOT"
ENV_COMPUTE_EXECUTOR = "LITHI_COMPUTE_EXECUTOR"
ENV_CACHE_DIR = "LITHI_CACHE_DIR"
#: ``ref=ENV_VAR,ref2=ENV_VAR2``: credential refs registered for downloads (names only).
ENV_CREDENTIAL_REFS = "LITHI_CREDENTIAL_REFS"


_PROJECT_ROOT = Path(__file__).resolve().parents[1]


def lithi_home() -> Path:
    """``$LITHI_HOME``, or ``.lithi`` in the project root (as ``resources.settings`` has it)."""
    return Path(os.environ.get(ENV_HOME) or _PROJECT_ROOT / ".lithi").resolve()


def default_compute_root() -> str:
    """``$LITHI_COMPUTE_ROOT``, or ``<LITHI_HOME>/compute``."""
    return os.environ.get(ENV_COMPUTE_ROOT) or str(lithi_home() / "compute")


def default_cache_dir() -> str:
    """``$LITHI_CACHE_DIR``, or ``<LITHI_HOME>/cache``."""
    return os.environ.get(ENV_CACHE_DIR) or str(lithi_home() / "cache")


def parse_credential_refs(text: str) -> dict[str, str]:
    """Parse ``ref=ENV_VAR,ref2=ENV_VAR2`` (the ``LITHI_CREDENTIAL_REFS`` format) into a dict."""
    refs: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        ref, sep, env = item.partition("=")
        if not sep or not ref.strip() or not env.strip():
            raise ValueError(f"{ENV_CREDENTIAL_REFS}: expected 'ref=ENV_VAR', found {item!r}")
        refs[ref.strip()] = env.strip()
    return refs


class ComputeResource(dg.ConfigurableResource):
    """The Compute service the chain submits to and watches (the local one by default)."""

    root: str | None = Field(
        default=None,
        description="Local Compute root; empty means $LITHI_COMPUTE_ROOT or <LITHI_HOME>/compute.",
    )
    executor: str = Field(
        default="subprocess",
        description="'subprocess': each job attempt is a detached process; 'inline': in-process.",
    )
    credential_refs: dict[str, str] = Field(
        default_factory=dict,
        description="credential_ref -> NAME of the environment variable holding its secret.",
    )

    def client(self) -> ComputeClient:
        """A client of the configured Compute service (cheap; state is on disk, not in here)."""
        if self.executor not in ("subprocess", "inline"):
            raise ValueError(f"executor must be 'subprocess' or 'inline', found {self.executor!r}")
        return LocalCompute(
            Path(self.root or default_compute_root()),
            self.executor,  # type: ignore[arg-type]
            credentials=CredentialRegistry(self.credential_refs),
        )


class BundleStoreResource(dg.ConfigurableResource):
    """Where bundles are downloaded to: a content-addressed local cache over fsspec locations."""

    cache_dir: str | None = Field(
        default=None,
        description="Cache directory; empty means $LITHI_CACHE_DIR or <LITHI_HOME>/cache.",
    )
    credential_refs: dict[str, str] = Field(
        default_factory=dict,
        description="credential_ref -> NAME of the environment variable holding its secret.",
    )

    def store(self) -> BundleStore:
        """The bundle store over the configured cache, with the registered credential refs."""
        return BundleStore(
            Path(self.cache_dir or default_cache_dir()), CredentialRegistry(self.credential_refs)
        )


def _env_or(name: str, default: str) -> str:
    """``dg.EnvVar(name)`` if the variable is set (Dagster shows it env-sourced), else default."""
    return dg.EnvVar(name) if os.environ.get(name) else default


def default_resources() -> dict[str, dg.ConfigurableResource]:
    """The embedded defaults, keyed ``compute`` and ``bundle_store``, overridable from the env."""
    refs = parse_credential_refs(os.environ.get(ENV_CREDENTIAL_REFS, ""))
    return {
        "compute": ComputeResource(
            root=_env_or(ENV_COMPUTE_ROOT, str(lithi_home() / "compute")),
            executor=_env_or(ENV_COMPUTE_EXECUTOR, "subprocess"),
            credential_refs=refs,
        ),
        "bundle_store": BundleStoreResource(
            cache_dir=_env_or(ENV_CACHE_DIR, str(lithi_home() / "cache")),
            credential_refs=refs,
        ),
    }
