"""Two real torchrun ranks: steps run under ``Join`` only where the ranks' shares differ in
batches, and only beyond the shorter share. Join all-reduces a flag on every step of its own, so
where every rank still has batches it is pure cost; beyond that it is what keeps the longer
rank from hanging."""

from __future__ import annotations

import json

import pytest

from pipeline.readers import make_loader
from pipeline.training.runner import TrainSummary
from tests.helpers.torchrun import run_torchrun
from tests.helpers.training import BATCH, EPOCHS, N, classes_index, fit_config


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("style", "uneven"), [("map", False), ("iterable", True)])
def test_the_ranks_join_only_where_their_shares_differ_in_batches(tmp_path, style, uneven):
    index = classes_index(tmp_path / "bundle")
    batches = [
        len(make_loader(index, style=style, batch_size=BATCH, num_workers=0, rank=r, world_size=2))
        for r in (0, 1)
    ]
    assert (batches[0] != batches[1]) == uneven, batches  # the case this parameter names
    marks, out = tmp_path / "joined", tmp_path / "out"
    marks.mkdir()
    proc = run_torchrun(
        2, "-m", "tests.helpers.fit_joined", str(index.snapshot.root), str(out),
        str(tmp_path / "progress"), json.dumps(fit_config(style)), "0",
        timeout=300, env={"JOIN_MARKS": str(marks)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = TrainSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.reconciliation.ok and summary.reconciliation.items_iterated == N
    assert sorted(p.name for p in marks.iterdir()) == (["rank-0", "rank-1"] if uneven else [])
    if uneven:  # only the steps beyond the shorter share ran under Join, on the longer rank
        joined = [int((marks / f"rank-{r}").read_text()) for r in (0, 1)]
        assert joined == [EPOCHS * (b - min(batches)) for b in batches], (joined, batches)
