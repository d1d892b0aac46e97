"""The bundle store under concurrency: processes fetching one version into one cache at once."""

from __future__ import annotations

import json
import multiprocessing

import pyarrow as pa

from pipeline.bundle.stage import stage
from tests.helpers.fetchers import fetch_rounds
from tests.helpers.timing import limit


def _table(start: int, n: int) -> pa.Table:
    ids = [f"item-{i:05d}" for i in range(start, start + n)]
    return pa.table({"id": ids, "x": pa.array([float(i) for i in range(start, start + n)])})


def test_concurrent_fetches_of_one_version_all_succeed_identically(tmp_path):
    """8 processes fetch one version into one empty cache at the same moment, 20 rounds."""
    workers, rounds = 8, 20
    src = stage(
        _table(0, 1000), tmp_path / "src", id_field="id", kind="input", rows_per_part=50,
        version_id="v1",
    )  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(
            target=fetch_rounds,
            args=(w, str(src.root), str(tmp_path / "cache"), rounds, barrier, results),
        )
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        seen = [results.get(timeout=limit(600)) for _ in range(workers * rounds)]
    finally:
        for p in procs:
            p.join(timeout=limit(60))
    errors = [s for s in seen if s[2] != "ok"]
    assert errors == [], f"{len(errors)} of {workers * rounds} fetches failed: {errors[:5]}"
    for r in range(rounds):
        outcomes = {s[3] for s in seen if s[1] == r}
        assert len(outcomes) == 1, f"round {r}: the workers saw {len(outcomes)} different views"
        path, identity, _ = outcomes.pop()
        assert json.loads(identity) == src.identity.model_dump()
        assert path == str(tmp_path / "cache" / f"round-{r:02d}" / "bundles" / "v1")
