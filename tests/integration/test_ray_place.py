"""A rank that dies before it answers is asked for again: right after a node is lost Ray may
still count it alive and place a restarted rank there, which then dies with the node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.timing import limit

ray = pytest.importorskip("ray")


def test_a_rank_that_dies_before_it_answers_is_placed_again(tmp_path, monkeypatch):
    from pipeline.defs import ray_launch

    first = tmp_path / "first-died"

    @ray.remote
    class DiesOnce:
        def __init__(self, marker: str) -> None:
            if not Path(marker).exists():  # the first one lands on a node that is gone
                Path(marker).touch()
                os._exit(1)

        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    class Placing:  # what _place asks for: Rank.options(...).remote()
        @staticmethod
        def options(**kw):
            class Bound:
                @staticmethod
                def remote():
                    return DiesOnce.options(**kw).remote(str(first))

            return Bound

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        monkeypatch.setattr(ray_launch, "Rank", Placing)
        placed = ray_launch._place(1, {"num_cpus": 1, "max_restarts": 0}, limit(120))
        assert first.exists()  # the first rank died before it answered
        assert len(placed) == 1 and ray_launch._answering(placed, limit(30)) == [True]
    finally:
        ray.shutdown()
