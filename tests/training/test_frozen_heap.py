"""A fit runs with the heap it started with frozen out of Python's collector (its loops make
short-lived objects by the million; a full collection would rescan every module each time),
and the process's collector is as it was once the fit returns, whatever the fit did."""

from __future__ import annotations

import gc

import pytest

from pipeline.training import REFERENCE_TRAINER, load_trainer, run_fit
from pipeline.training.memory import frozen_heap
from tests.helpers.training import classes_index, fit_config


class _Watching:
    """The reference trainer, noting what the collector had frozen while it fitted."""

    def __init__(self, fail: bool = False) -> None:
        self.inner = load_trainer(REFERENCE_TRAINER)
        self.Config = self.inner.Config
        self.fail = fail
        self.frozen_during: int | None = None

    def parse_config(self, config):
        return self.inner.parse_config(config)

    def fit(self, ctx):
        self.frozen_during = gc.get_freeze_count()
        if self.fail:
            raise RuntimeError("the node went away")
        return self.inner.fit(ctx)


def test_the_fit_runs_frozen_and_the_collector_is_as_it_was_after(tmp_path):
    index = classes_index(tmp_path)
    before = gc.get_freeze_count()
    trainer = _Watching()
    out = tmp_path / "out"
    out.mkdir()
    run = run_fit(trainer, index, fit_config("iterable"), output_dir=out, log=print)
    assert run.reconciliation.ok
    assert trainer.frozen_during is not None and trainer.frozen_during > before
    assert gc.get_freeze_count() == before


def test_a_fit_that_raises_leaves_the_collector_as_it_was(tmp_path):
    index = classes_index(tmp_path)
    before = gc.get_freeze_count()
    with pytest.raises(RuntimeError, match="went away"):
        run_fit(_Watching(fail=True), index, fit_config("iterable"), output_dir=tmp_path / "out")
    assert gc.get_freeze_count() == before


def test_objects_made_inside_are_still_collected():
    class Cycle:
        pass

    with frozen_heap():
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2  # a cycle made in the block is found and freed


def test_a_freeze_made_outside_is_left_as_it_is():
    gc.freeze()
    try:
        with frozen_heap():
            pass
        # still frozen (the count itself falls as frozen objects are freed meanwhile)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
