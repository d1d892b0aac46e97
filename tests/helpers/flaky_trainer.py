"""The reference trainer, failing its first fit: a transient error, for run-retry tests.

The first call creates the marker file named by ``$FLAKY_TRAINER_MARKER`` and raises; later
calls (a retried run) train normally. Select it with
``LITHI_TRAINER=tests.helpers.flaky_trainer:FailsOnce``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.training.reference import ReferenceTrainer
from pipeline.training.trainer import FitContext, FitResult


class FailsOnce(ReferenceTrainer):
    """Raises on the first fit ever (per marker file), trains on every later one."""

    def fit(self, ctx: FitContext) -> FitResult:
        """Fail once, then train like the reference trainer."""
        marker = Path(os.environ["FLAKY_TRAINER_MARKER"])
        if not marker.exists():
            marker.write_text("failed once\n")
            raise RuntimeError("injected transient failure (a worker lost mid-training)")
        return super().fit(ctx)
