"""bench/model_floor.py's two figures come from what they say: a training step timed while a
real loader reads the bundle in another process, and real DDP ranks over gloo (no timing is
asserted: the rates are the bench's to report)."""

from __future__ import annotations

import importlib
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from pipeline.training.features import FeatureColumn, FeatureSpec
from pipeline.training.model import MLP, save_checkpoint
from tests.helpers.bundles import make_bundle

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch):
    # chain.py imports model_floor as a sibling, as when it runs from bench/; so do the ranks
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    # imported by name, so the spawned ranks find the same functions by name
    return _load("chain"), importlib.import_module("model_floor")


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    spec = FeatureSpec(
        task="classification",
        label="y",
        columns=[FeatureColumn(name="x", width=4, nullable=False)],
        mean=[0.0] * 4,
        std=[1.0] * 4,
        classes=["a", "b", "c"],
    )
    state = MLP(spec.dim, 8, spec.outputs).state_dict()
    path = tmp_path / "model.pt"
    save_checkpoint(path, state_dict=state, spec=spec, config={}, hidden=8)
    return path


def test_the_reader_runs_beside_the_body_and_is_stopped_after(bench, tmp_path):
    _, floor = bench
    snap = make_bundle(tmp_path / "b", [3000, 2000])
    with floor.reading_beside(snap.root) as reader:
        assert reader.poll() is None, "the reader has read a batch and is still reading"
    assert reader.poll() is not None, "the reader is stopped once the body is done"


def test_a_reader_that_cannot_read_is_said_not_to_have_started(bench, tmp_path):
    _, floor = bench
    with pytest.raises(RuntimeError, match="did not start"):
        with floor.reading_beside(tmp_path / "no-such-bundle"):
            pass


def test_the_model_rates_include_the_step_beside_a_reader(bench, checkpoint, tmp_path):
    chain, _ = bench
    snap = make_bundle(tmp_path / "b", [3000])
    before = torch.get_num_threads()
    rates = chain.model_rates(checkpoint, 16, steps=5, threads=1, beside=snap.root)
    assert set(rates) == {
        "model_train_rows_per_s",
        "model_predict_rows_per_s",
        "model_train_beside_reading_rows_per_s",
    }
    assert all(math.isfinite(v) and v > 0 for v in rates.values())
    assert torch.get_num_threads() == before  # the fit's threads only while it measured


def test_two_ranks_step_together_under_ddp_and_say_their_rows_per_second(bench, checkpoint):
    _, floor = bench
    rate = floor.ranks_rows_per_s(checkpoint, 16, world=2, steps=5)
    assert math.isfinite(rate) and rate > 0
