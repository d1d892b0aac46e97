"""The reference trainer: the project's own :class:`~pipeline.training.Trainer`, a small MLP.

It is one implementation of the interface any user trainer implements, chosen by default
(``pipeline.training.reference:ReferenceTrainer``). Classification or regression, an explicit
label and feature list (or ``auto_features`` when asked, with what it chose and left out in the
record), numbers and string categories, rows weighted by ``lithi_confidence`` and filtered to
accepted ones, missing values filled and counted (or rows dropped, or the fit refused).
"""

from __future__ import annotations

import importlib.metadata

import pyarrow as pa

from pipeline.bundle.manifest import Schema
from pipeline.training.fit import fit_reference
from pipeline.training.predict import predict_reference
from pipeline.training.reference_config import ReferenceConfig, check_config
from pipeline.training.trainer import FitContext, FitResult, PredictContext, Trainer


def _project_version() -> str | None:
    try:
        return importlib.metadata.version("lithi-train")
    except importlib.metadata.PackageNotFoundError:
        return None


class ReferenceTrainer(Trainer):
    """The reference MLP trainer; :attr:`Config` is
    :class:`~pipeline.training.reference_config.ReferenceConfig`."""

    Config = ReferenceConfig
    version = _project_version()

    def check(self, config: ReferenceConfig, schema: Schema, id_field: str) -> None:
        """Refuse a label or feature ``schema`` cannot give, in one line
        (:func:`~pipeline.training.fit.check_config`)."""
        check_config(config, schema, id_field)

    def fit(self, ctx: FitContext) -> FitResult:
        """Train the MLP and write ``model.pt`` (:func:`~pipeline.training.fit.fit_reference`)."""
        return fit_reference(ctx)

    def predict(self, ctx: PredictContext) -> pa.RecordBatchReader:
        """Every item, streamed: :func:`~pipeline.training.predict.predict_reference`."""
        return predict_reference(ctx)
