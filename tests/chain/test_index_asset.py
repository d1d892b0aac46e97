"""The ``disjoint_index`` asset's metadata shows how the split falls: per rank, per owner."""

from __future__ import annotations

import dagster as dg

from assets.disjoint_index import disjoint_index
from resources.dagster.chain_settings import ChainSettings
from tests.helpers.bundles import make_bundle


def test_the_index_reports_each_ranks_iterable_rows_and_their_spread(tmp_path):
    # 8 equal parts on 2 ranks x 3 workers: whole parts go to ranks first, 4 and 4.
    snap = make_bundle(tmp_path, [50] * 8)
    out = disjoint_index(
        verified_snapshot=snap, chain_settings=ChainSettings(world_size=2, num_workers=3)
    )
    assert isinstance(out, dg.Output)
    meta = out.metadata
    assert meta["iterable_rank_spread"].value == 0
    assert meta["iterable_rank_rows"].value.splitlines()[2:] == ["| 0 | 200 |", "| 1 | 200 |"]
    owners = meta["iterable_part_owners"].value.splitlines()[2:]
    assert [row.split(" | ")[0].strip("| ") for row in owners] == [
        "0/0", "0/1", "0/2", "1/0", "1/1", "1/2"
    ]  # fmt: skip
    assert sum(int(row.split(" | ")[2].strip("| ")) for row in owners) == 400


def test_an_uneven_layout_shows_its_spread(tmp_path):
    # the docs' 1,009-item layout: 7 uneven parts on 2 ranks
    snap = make_bundle(tmp_path, [1, 300, 2, 250, 100, 199, 157])
    out = disjoint_index(
        verified_snapshot=snap, chain_settings=ChainSettings(world_size=2, num_workers=1)
    )
    rows = [
        int(line.split(" | ")[1].strip("| "))
        for line in out.metadata["iterable_rank_rows"].value.splitlines()[2:]
    ]
    assert sum(rows) == 1009 and out.metadata["iterable_rank_spread"].value == max(rows) - min(rows)
    assert out.metadata["iterable_rank_spread"].value <= 5  # 502 / 507: balanced by rows
