"""The reference trainer, whose node is lost mid-fit: for the Ray node-loss test.

On the first fit ever (per the marker file ``$STALL_MARKER``), rank ``$STALL_RANK`` stops
after its ``$STALL_AFTER``-th training step (counted as :mod:`tests.helpers.killed_trainer`
counts), having done everything with the earlier batches, mid-fit cuts included. It writes the
marker, naming its node's ``LITHI_HOME``, and waits there: the test then SIGKILLs every process
of that node, as a machine lost mid-epoch. Later fits train like the reference trainer. Select
it with ``tests.helpers.stalled_trainer:NodeLostOnce``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

from pipeline.training.reference import ReferenceTrainer
from pipeline.training.trainer import FitContext, FitResult, TalliedLoader
from tests.helpers.killed_trainer import arm_first_loader, training_epoch


class _StallingLoader(TalliedLoader):
    stall_after: int
    marker: Path

    def __iter__(self) -> Iterator[dict]:
        for batch in super().__iter__():
            yield batch
            if not training_epoch(self):
                continue
            self.yielded = getattr(self, "yielded", 0) + 1
            if self.yielded == self.stall_after:
                self.marker.write_text(os.environ.get("LITHI_HOME", ""))
                threading.Event().wait()  # until this node's processes are killed


class NodeLostOnce(ReferenceTrainer):
    """The reference trainer; its first fit stalls on one rank until the test kills its node."""

    def fit(self, ctx: FitContext) -> FitResult:
        """Arm the stall on the first loader of the chosen rank, once; then train as usual."""
        arm_first_loader(
            ctx,
            Path(os.environ["STALL_MARKER"]),
            int(os.environ.get("STALL_RANK", "1")),
            _StallingLoader,
            stall_after=int(os.environ["STALL_AFTER"]),
        )
        return super().fit(ctx)
