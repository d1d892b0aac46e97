"""``disjoint_index``: the index built once from the verified manifest, saved, with its owners."""

import dagster as dg

from assets import _metadata as md
from assets._group import CHAIN_GROUP
from assets.refs import IndexRef, SnapshotRef, verify_snapshot
from pipeline.readers.index import Index
from pipeline.readers.split import plan_split
from resources.dagster_resources import BundleStoreResource
from resources.settings import ChainSettings

DISJOINT_AND_COVERING = "index_disjoint_and_covering"


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
    snapshot = verify_snapshot(verified_snapshot, bundle_store.store().trusted)
    index = Index.from_snapshot(snapshot)
    out = chain_settings.artifacts() / "disjoint_index" / context.run.run_id
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.parquet"
    index.save(path)
    plan = plan_split(
        len(index), index.part_rows, chain_settings.world_size, chain_settings.num_workers
    )
    yield dg.AssetCheckResult(
        check_name=DISJOINT_AND_COVERING,
        passed=plan.ok,
        metadata={"problems": "\n".join(plan.problems) or "none", "items": len(index)},
    )
    if not plan.ok:
        raise dg.Failure("the split is not exactly-once: " + "; ".join(plan.problems))
    rank_rows = [[r, n] for r, n in enumerate(plan.rank_sizes)]
    part_rows = [
        [o, ",".join(map(str, owned)) or "—", sum(index.part_rows[p] for p in owned)]
        for o, owned in enumerate(plan.part_owners)
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
            "map_style_shares": md.markdown_table(["rank", "items"], rank_rows),
            "iterable_part_owners": md.markdown_table(["owner", "parts", "rows"], part_rows),
        },
        data_version=dg.DataVersion(index.digest),
    )
