"""``disjoint_index``: the index built once from the verified manifest, with its owners."""

import dagster as dg

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from pipeline.bundle.verify import VerifiedSnapshot
from pipeline.readers.index import Index
from pipeline.readers.split import plan_split
from resources.dagster.chain_settings import ChainSettings


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"python", "pytorch"},
    code_version="3",
)
def disjoint_index(
    verified_snapshot: VerifiedSnapshot, chain_settings: ChainSettings
) -> dg.Output[Index]:
    """The disjoint index: built once from the verified manifest (never by listing a directory),
    ids kept as an Arrow string array, saved so a run can pin it. Map-style readers split its
    positions across ranks; iterable readers own whole parts."""
    index = Index.from_snapshot(verified_snapshot)
    # laid out for the metadata; the blocking check below proves it item by item
    plan = plan_split(
        len(index),
        index.part_rows,
        chain_settings.world_size,
        chain_settings.num_workers,
        prove=False,
    )
    rank_rows = [[r, n] for r, n in enumerate(plan.rank_sizes)]
    workers = max(chain_settings.num_workers, 1)
    part_rows = [
        [
            f"{o // workers}/{o % workers}",
            ",".join(map(str, owned)) or "—",
            sum(index.part_rows[p] for p in owned),
        ]
        for o, owned in enumerate(plan.part_owners)
    ]
    iterable_ranks = [[r, n] for r, n in enumerate(plan.iterable_rank_rows)]
    return dg.Output(
        index,
        metadata={
            "index_sha256": md.digest(index.digest),
            **md.identity("snapshot", verified_snapshot.identity),
            "items": len(index),
            "parts": len(index.part_rows),
            "world_size": chain_settings.world_size,
            "num_workers": chain_settings.num_workers,
            "map_style_shares": md.markdown_table(["rank", "items"], rank_rows),
            "iterable_part_owners": md.markdown_table(["rank/worker", "parts", "rows"], part_rows),
            # Whole parts go to ranks first, balanced by rows: a rank that reads far fewer rows
            # than another idles in DDP's Join while the other finishes.
            "iterable_rank_rows": md.markdown_table(["rank", "rows"], iterable_ranks),
            "iterable_rank_spread": plan.iterable_rank_spread,
        },
        data_version=dg.DataVersion(index.digest),
    )


@dg.asset_check(
    asset=disjoint_index,
    blocking=True,
    description="Every item has exactly one owner; every part exactly one iterable owner "
    "(proved with the readers' own split functions for the configured ranks and workers).",
)
def index_disjoint_and_covering(
    disjoint_index: Index, chain_settings: ChainSettings
) -> dg.AssetCheckResult:
    """Lay the split out for the configured world and prove it exactly-once."""
    plan = plan_split(
        len(disjoint_index),
        disjoint_index.part_rows,
        chain_settings.world_size,
        chain_settings.num_workers,
    )
    return dg.AssetCheckResult(
        passed=plan.ok,
        metadata={
            "problems": "\n".join(plan.problems) or "none",
            "items": len(disjoint_index),
            "world_size": chain_settings.world_size,
            "num_workers": chain_settings.num_workers,
        },
    )
