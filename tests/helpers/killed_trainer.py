"""The reference trainer, SIGKILLed once mid-fit: a preempted node, for resume tests.

On the first fit ever (per the marker file ``$KILL_MARKER``), rank ``$KILL_RANK`` (default 0)
kills its own process with SIGKILL as it asks for the batch after its ``$KILL_AFTER``-th training
step (a batch of an epoch from 1 on of its first loader: the fitting pass, epoch 0, reads in
batches of its own size and does not count), so everything it did with earlier batches, mid-fit
cuts included, is done, and nothing after. Later fits (a torchrun restart, a retried run) train like
the reference trainer. Select it with ``tests.helpers.killed_trainer:KilledOnce``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

from pipeline.training.reference import ReferenceTrainer
from pipeline.training.trainer import FitContext, FitResult, TalliedLoader


class _KillingLoader(TalliedLoader):
    kill_after: int
    marker: Path

    def __iter__(self) -> Iterator[dict]:
        for batch in super().__iter__():
            yield batch
            if not training_epoch(self):
                continue
            self.yielded = getattr(self, "yielded", 0) + 1
            if self.yielded == self.kill_after:
                self.marker.write_text(f"killed after batch {self.kill_after}\n")
                os.kill(os.getpid(), signal.SIGKILL)


def training_epoch(loader: TalliedLoader) -> bool:
    """Whether ``loader`` is in a training epoch (1 on); epoch 0 is the fitting pass."""
    return loader.loader.epoch >= 1


def arm_first_loader(ctx: FitContext, marker: Path, rank: int, cls: type, **attrs: object) -> None:
    """On the first fit ever (no ``marker`` yet) of rank ``rank``, make the first loader the
    trainer asks for a ``cls`` (a :class:`TalliedLoader` subclass) with ``attrs`` set."""
    if marker.exists() or ctx.rank != rank:
        return
    make, armed = ctx.loader, []

    def loader(**kw):
        tallied = make(**kw)
        if not armed:
            armed.append(tallied)
            tallied.__class__ = cls
            for name, value in {"marker": marker, **attrs}.items():
                setattr(tallied, name, value)
        return tallied

    ctx.loader = loader  # type: ignore[method-assign]


class KilledOnce(ReferenceTrainer):
    """The reference trainer; its first fit dies by SIGKILL after ``$KILL_AFTER`` training
    steps."""

    def fit(self, ctx: FitContext) -> FitResult:
        """Arm the kill on the first loader of the chosen rank, once; then train as usual."""
        arm_first_loader(
            ctx,
            Path(os.environ["KILL_MARKER"]),
            int(os.environ.get("KILL_RANK", "0")),
            _KillingLoader,
            kill_after=int(os.environ["KILL_AFTER"]),
        )
        return super().fit(ctx)
