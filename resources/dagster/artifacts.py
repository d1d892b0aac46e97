"""Where each asset keeps its files for one run: ``<root>/<asset>/<run_id>/``.

The one place the layout of run artifacts is defined. An asset that writes files of its own (a
checkpoint, a record) asks :meth:`ArtifactStore.directory` for its folder; the IO manager writes
what an asset returns into the same folder. A folder belongs to one asset and one run, so no step
ever writes into another step's artifacts.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field


class ArtifactStore(dg.ConfigurableResource):
    """The root of run artifacts: indexes, checkpoints, records, predictions."""

    root: str = Field(description="Root directory of run artifacts (LITHI_ARTIFACTS_DIR).")

    def path(self, asset_key: dg.AssetKey, run_id: str) -> Path:
        """The folder of ``asset_key``'s artifacts in run ``run_id`` (not created)."""
        return Path(self.root).resolve().joinpath(*asset_key.path, run_id)

    def progress(self, asset_key: dg.AssetKey, key: str) -> Path:
        """Where ``asset_key``'s mid-fit cuts named ``key`` live (not created): beside its run
        folders and outside any one of them, so the retry of a killed run finds them."""
        return Path(self.root).resolve().joinpath(*asset_key.path, "_progress", key)

    def directory(self, context: dg.AssetExecutionContext) -> Path:
        """This asset's folder in this run, created if needed."""
        d = self.path(context.asset_key, context.run.run_id)
        d.mkdir(parents=True, exist_ok=True)
        return d
