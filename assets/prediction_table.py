"""``prediction_table``: one prediction for every item of the index, keyed by the same id."""

import dagster as dg
import pyarrow as pa

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import Schema
from pipeline.readers.reconcile import keyed_coverage
from pipeline.training.predict import predict
from pipeline.training.record import TrainedModel

ONE_ROW_PER_ITEM = "one_row_per_item"


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"pytorch", "parquet"},
    code_version="2",
    check_specs=[
        dg.AssetCheckSpec(
            ONE_ROW_PER_ITEM,
            asset="prediction_table",
            blocking=True,
            description="Exactly one row per index item: same ids, no duplicates, none missing.",
        )
    ],
)
def prediction_table(training_run: TrainedModel):
    """Predictions for every item of the index, failed and abstained items included, keyed by
    the same string id, with the prediction, its score and the checkpoint digest."""
    index = training_run.index
    table: pa.Table = predict(
        index, training_run.checkpoint, checkpoint_sha256=training_run.record.checkpoint_sha256
    )
    coverage = keyed_coverage(index.ids, table.column(index.id_field))
    yield dg.AssetCheckResult(
        check_name=ONE_ROW_PER_ITEM,
        passed=coverage.ok,
        metadata={
            "rows": coverage.rows,
            "items": coverage.items,
            "problems": "\n".join(coverage.problems()) or "none",
        },
    )
    by_status, _ = fmt.count_statuses(table.column(fmt.STATUS_COLUMN))
    yield dg.Output(
        table,
        metadata={
            "dagster/row_count": table.num_rows,
            "dagster/column_schema": md.column_schema(
                Schema.from_arrow(table.schema), index.id_field
            ),
            **md.identity("snapshot", index.snapshot.identity),
            "checkpoint_sha256": training_run.record.checkpoint_sha256,
            **{f"rows_{k}": v for k, v in by_status.items()},
        },
    )
