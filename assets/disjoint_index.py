"""``disjoint_index``: the index built once from the verified manifest, saved, with its owners."""

import dagster as dg

from assets import metadata as md
from assets.refs import IndexRef, SnapshotRef
from pipeline import split
from pipeline.index import Index
from pipeline.jobs import CHAIN_GROUP
from pipeline.verify import verify
from resources.dagster_resources import BundleStoreResource
from resources.settings import ChainSettings

DISJOINT_AND_COVERING = "index_disjoint_and_covering"


def owner_plan(index: Index, world_size: int, num_workers: int) -> dict:
    """Map-style positions per rank and whole parts per (rank, worker), from the pure split."""
    n = len(index)
    ranks = [split.share_bounds(n, r, world_size) for r in range(world_size)]
    owners = max(1, world_size * max(num_workers, 1))
    parts = split.assignment(index.part_rows, owners)
    return {"ranks": ranks, "parts": parts}


def coverage_problems(index: Index, plan: dict) -> list[str]:
    """Every position exactly once across ranks; every part exactly once across owners."""
    problems = []
    seen = sorted(p for a, b in plan["ranks"] for p in range(a, b))
    if seen != list(range(len(index))):
        problems.append(f"map-style shares cover {len(set(seen))}/{len(index)} items, {len(seen)}")
    parts = sorted(p for owned in plan["parts"] for p in owned)
    if parts != list(range(len(index.part_rows))):
        problems.append(f"iterable assignment holds parts {parts}, expected each part once")
    return problems


@dg.asset(
    group_name=CHAIN_GROUP,
    kinds={"python", "pytorch"},
    code_version="1",
    description="The disjoint index: built once from the verified manifest (never by listing a "
    "directory), ids kept as an Arrow string array, saved to a file a run can pin. Map-style "
    "readers split its positions across ranks; iterable readers own whole parts.",
    check_specs=[
        dg.AssetCheckSpec(
            DISJOINT_AND_COVERING,
            asset="disjoint_index",
            blocking=True,
            description="Every item has exactly one owner; every part exactly one iterable owner.",
        )
    ],
)
def disjoint_index(
    context: dg.AssetExecutionContext,
    verified_snapshot: SnapshotRef,
    bundle_store: BundleStoreResource,
    chain_settings: ChainSettings,
):
    """Build and save the index; report per-owner sizes and prove the split covers every item."""
    snapshot = verify(verified_snapshot.path, trusted=bundle_store.store().trusted)
    index = Index.from_snapshot(snapshot)
    out = chain_settings.artifacts() / "disjoint_index" / context.run.run_id
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.parquet"
    index.save(path)
    plan = owner_plan(index, chain_settings.world_size, chain_settings.num_workers)
    problems = coverage_problems(index, plan)
    yield dg.AssetCheckResult(
        check_name=DISJOINT_AND_COVERING,
        passed=not problems,
        metadata={"problems": "\n".join(problems) or "none", "items": len(index)},
    )
    if problems:
        raise dg.Failure("the split is not exactly-once: " + "; ".join(problems))
    rank_rows = [[r, a, b, b - a] for r, (a, b) in enumerate(plan["ranks"])]
    part_rows = [
        [o, ",".join(map(str, owned)) or "—", sum(index.part_rows[p] for p in owned)]
        for o, owned in enumerate(plan["parts"])
    ]
    yield dg.Output(
        IndexRef(path=str(path), digest=index.digest, snapshot=verified_snapshot),
        metadata={
            "index_sha256": index.digest,
            **md.identity("snapshot", snapshot.identity),
            "items": len(index),
            "parts": len(index.part_rows),
            "world_size": chain_settings.world_size,
            "num_workers": chain_settings.num_workers,
            "index_path": dg.MetadataValue.path(str(path)),
            "map_style_shares": md.markdown_table(["rank", "start", "stop", "items"], rank_rows),
            "iterable_part_owners": md.markdown_table(["owner", "parts", "rows"], part_rows),
        },
        data_version=dg.DataVersion(index.digest),
    )
