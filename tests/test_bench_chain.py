"""bench/chain.py's own arithmetic and memory probe (no timing is asserted, ever)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.timing import limit

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chain():
    spec = importlib.util.spec_from_file_location("bench_chain", ROOT / "bench" / "chain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results(walls: dict[int, dict[str, float]]) -> dict:
    limits = {
        "sha256_bytes_per_s": 1e9,
        "decode_rows_per_s": 1e6,
        "decode_id_rows_per_s": 1e7,
        "write_rows_per_s": 1e6,
        "write_id_rows_per_s": 4e6,
        "loader_rows_per_s": 1e6,
        "copy_bytes_per_s": 5e8,
    }
    runs = []
    for items, steps in walls.items():
        step = {"wall": 1.0, "hashed": 0, "bytes_written": 0, "limits": limits}
        by_world = {
            1: {name: {**step, "step_wall": wall, "passes": 3} for name, wall in steps.items()}
        }
        runs.append({"items": items, "steps": {"stage": step, "label": step}, "by_world": by_world})
    return {"runs": runs}


def test_exponents_are_the_log_log_slopes(chain):
    results = _results(
        {
            1_000: {"verified_snapshot": 0.01, "training_run": 0.001},
            10_000: {"verified_snapshot": 0.1, "training_run": 0.1},
            100_000: {"verified_snapshot": 1.0, "training_run": 10.0},
        }
    )
    exps = chain.exponents(results)
    assert exps[("1", "verified_snapshot")] == pytest.approx(1.0)
    assert exps[("1", "training_run")] == pytest.approx(2.0)  # superlinear shows as 2


def test_the_targets_exponent_is_between_the_two_largest_sizes(chain):
    """The scale target names the slope from 10^6 to 10^7; a start-up cost at the smallest size
    must not pull it down (over every size, the slope here is 0.5)."""
    results = _results(
        {
            1_000: {"training_run": 1.0},
            10_000: {"training_run": 1.0},
            100_000: {"training_run": 10.0},
        }
    )
    assert chain.exponents(results)[("1", "training_run")] == pytest.approx(0.5)
    assert chain.exponents(results, largest_two=True)[("1", "training_run")] == pytest.approx(1.0)
    # against its limit (linear in items here, the same rates at every size): flat
    ratio = chain.exponents(results, largest_two=True, of_ratio=True)
    assert ratio[("1", "training_run")] == pytest.approx(0.0)


def test_limits_count_the_work_each_step_must_do(chain):
    lim = _results({1: {}})["runs"][0]["steps"]["stage"]["limits"]
    m = {"hashed": 2e9, "passes": 3, "bytes_written": 0}
    # verify: hash every byte, decode the ids
    assert chain.limit_seconds("verified_snapshot", 10**6, m, lim, 0) == pytest.approx(2.1)
    # ... and bring what it downloaded into the cache at the disk's durable rate
    copied = {**m, "bytes_copied": 1e9}
    assert chain.limit_seconds("verified_snapshot", 10**6, copied, lim, 0) == pytest.approx(4.1)
    # ... where measured: decode the statuses beside the ids, and find no id twice
    checked = {**lim, "decode_checked_rows_per_s": 5e6, "unique_rows_per_s": 2e6}
    assert chain.limit_seconds("verified_snapshot", 10**6, m, checked, 0) == pytest.approx(
        2 + 0.2 + 0.5
    )
    # index: decode the ids, save them
    assert chain.limit_seconds("disjoint_index", 10**6, m, lim, 0) == pytest.approx(0.35 + 2)
    # training: every pass at the loader's own rate
    assert chain.limit_seconds("training_run", 10**6, m, lim, 0) == pytest.approx(3 + 2)
    assert chain.limit_seconds("result_manifest", 10**6, m, lim, 0) == 0


def test_training_floor_keeps_every_core_busy_where_it_can(chain):
    """The floor: the fitting pass and the evaluation read (and score) on every core; each epoch
    takes the longer of its reading on the cores the steps leave and its training steps, timed
    beside a reader at world size 1 and as DDP ranks above it."""
    one_core = _results({1: {}})["runs"][0]["steps"]["stage"]["limits"]  # loader: 1e6 rows/s
    two_cores = {**one_core, "threads": 2}
    model = {"passes": 3, "epochs": 1, "model_train_rows_per_s": 2.5e5,
             "model_predict_rows_per_s": 5e5}  # fmt: skip
    # a pass of data 1 s; training 4 s, evaluation 2 s of arithmetic
    assert chain.training_floor(10**6, model, one_core) == pytest.approx(1 + 4 + (1 + 2))
    assert chain.training_floor(10**6, model, two_cores) == pytest.approx(0.5 + 4 + 1.5)
    beside = {**model, "model_train_beside_reading_rows_per_s": 2e5}  # 5 s beside a reader
    assert chain.training_floor(10**6, beside, two_cores) == pytest.approx(0.5 + 5 + 1.5)
    ranks = {**model, "model_ranks_rows_per_s": 1.25e5}  # 8 s of DDP steps
    assert chain.training_floor(10**6, ranks, two_cores, world=2) == pytest.approx(0.5 + 8 + 1.5)
    # a free model leaves the data: on one core the loader's own three passes, its limit
    free = {**model, "model_train_rows_per_s": math.inf, "model_predict_rows_per_s": math.inf}
    assert chain.training_floor(10**6, free, one_core) == pytest.approx(
        chain.limit_seconds("training_run", 10**6, {**free, "hashed": 0}, one_core, 0)
    )
    # ... on two, the epoch reads on the one core its steps leave, the other passes on both
    assert chain.training_floor(10**6, free, two_cores) == pytest.approx(0.5 + 1 + 0.5)
    two_epochs = {**beside, "passes": 4, "epochs": 2}
    assert chain.training_floor(10**6, two_epochs, two_cores) == pytest.approx(0.5 + 10 + 1.5)
    assert chain.training_floor(10**6, {"passes": 3}, two_cores) is None  # no model timed


def test_tree_memory_sees_a_child_process(chain):
    """The probe reads each process of the tree: a child holding 200 MiB is seen.

    The child holds its memory until told to exit, so one sample taken meanwhile must see it,
    however slowly the machine runs.
    """
    code = (
        "import sys; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]);"
        "print('holding', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "holding\n"
        mem = chain.TreeMemory(os.getpid(), Path("never-done"))
        mem.sample()
    finally:
        child.communicate("", timeout=limit(60))
    assert child.returncode == 0
    assert mem.peak_anon >= 190
    assert mem.peak_rss >= mem.peak_anon


def test_tree_memory_stops_where_the_step_says_it_is_done(chain, tmp_path):
    """What a child holds after its step (measuring its limits) is not the step's memory."""
    done = tmp_path / "step-done"
    done.touch()
    code = "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])"
    child = subprocess.Popen([sys.executable, "-c", code])
    with chain.TreeMemory(child.pid, done) as mem:
        assert child.wait(timeout=limit(60)) == 0
    assert mem.peak_rss == mem.peak_anon == 0  # never sampled: the step was already done


@pytest.mark.parametrize(
    ("world", "cores", "workers"), [(1, 2, 1), (2, 2, 0), (1, 1, 0), (2, 8, 3)]
)
def test_each_rank_gets_a_worker_per_core_it_does_not_compute_on(chain, world, cores, workers):
    assert chain.workers_per_rank(world, cores) == workers
