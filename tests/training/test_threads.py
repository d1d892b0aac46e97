"""torch's intra-op threads in a training process: its share of the cores, overridable."""

from __future__ import annotations

import importlib

import pytest
import torch

from pipeline.training.threads import intra_op_threads, torch_threads
from resources.dagster.chain_settings import ChainSettings

training_run = importlib.import_module("assets.training_run")


@pytest.mark.parametrize(
    ("cores", "ranks", "workers", "threads"),
    [
        (16, 1, 2, 14),  # one rank: the cores its DataLoader workers leave
        (16, 2, 2, 6),  # two ranks on the machine share it
        (16, 4, 0, 4),
        (2, 1, 2, 1),  # never fewer than one
        (2, 2, 0, 1),
        (1, 1, 0, 1),
    ],
)
def test_a_rank_takes_its_share_of_the_cores(cores, ranks, workers, threads):
    assert intra_op_threads(ranks, workers, cores=cores) == threads


def test_the_share_counts_only_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert intra_op_threads(1, 0) == 3


def test_threads_are_set_inside_the_block_and_put_back_after_it():
    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match=">= 1"):
        with torch_threads(0):
            pass


def test_the_in_process_step_trains_with_the_ranks_share_or_the_setting(monkeypatch, tmp_path):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    seen = []

    def fake_train_once(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return object()

    monkeypatch.setattr(training_run, "train_once", fake_train_once)
    before = torch.get_num_threads()
    for settings in (ChainSettings(num_workers=2), ChainSettings(num_workers=2, torch_threads=3)):
        training_run._train_in_process(
            None, None, {}, tmp_path, settings, tmp_path / "progress", print
        )
    assert seen == [6, 3]  # 8 cores less 2 workers; then the setting
    assert torch.get_num_threads() == before
