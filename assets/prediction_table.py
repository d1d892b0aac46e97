"""``prediction_table``: the trainer's prediction for every item of the index, keyed by its id."""

import dagster as dg
import pyarrow as pa

from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import Schema
from pipeline.readers.reconcile import keyed_coverage
from pipeline.training.device import choose_device
from pipeline.training.memory import bound_heap_growth
from pipeline.training.record import TrainedModel
from pipeline.training.trainer import PredictContext, TrainerError, load_trainer
from resources.dagster.chain_settings import ChainSettings


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"pytorch", "parquet"},
    code_version="4",
)
def prediction_table(
    context: dg.AssetExecutionContext, training_run: TrainedModel, chain_settings: ChainSettings
) -> dg.Output[pa.Table]:
    """Predictions for every item of the index — failed and abstained items included — made by
    the trainer that wrote the checkpoint, with its own config, keyed by the same string id."""
    index = training_run.index
    record = training_run.record
    trainer = load_trainer(record.trainer.path)
    bound_heap_growth()  # a prediction pass over millions of items: see pipeline.training.memory
    ctx = PredictContext(
        index=index,
        config=trainer.parse_config(record.config),
        num_workers=chain_settings.num_workers,
        log=context.log.info,
        device=choose_device(chain_settings.device),
        checkpoint_dir=training_run.checkpoint_dir,
        checkpoint_sha256=record.checkpoint.sha256,
    )
    table = trainer.predict(ctx)
    if not isinstance(table, pa.Table):
        raise TrainerError(
            f"{record.trainer.path}.predict returned {type(table).__name__}, expected pa.Table"
        )
    if index.id_field not in table.column_names:
        raise TrainerError(
            f"{record.trainer.path}.predict returned columns {table.column_names}: no id column "
            f"{index.id_field!r}, so no row can be matched to an item"
        )
    meta = {
        "dagster/row_count": table.num_rows,
        "dagster/column_schema": md.column_schema(Schema.from_arrow(table.schema), index.id_field),
        **md.identity("snapshot", index.snapshot.identity),
        "checkpoint_sha256": md.digest(record.checkpoint.sha256),
        **ctx.metadata,  # what the trainer says of its predictions (values filled, unseen)
    }
    if fmt.STATUS_COLUMN in table.column_names:
        by_status, _ = fmt.count_statuses(table.column(fmt.STATUS_COLUMN))
        meta.update(by_status)  # named as result_manifest names its counts
    return dg.Output(table, metadata=meta)


@dg.asset_check(
    asset=prediction_table,
    additional_ins={"training_run": dg.AssetIn("training_run")},
    blocking=True,
    description="Exactly one row per index item, keyed by the same string id: no duplicates, "
    "none missing, none extra (each named when it fails).",
)
def one_row_per_item(prediction_table: pa.Table, training_run: TrainedModel) -> dg.AssetCheckResult:
    """Match the table's id column against the training index."""
    index = training_run.index
    coverage = keyed_coverage(index.ids, prediction_table.column(index.id_field).cast(pa.string()))
    return dg.AssetCheckResult(
        passed=coverage.ok,
        metadata={
            "rows": coverage.rows,
            "items": coverage.items,
            "problems": "\n".join(coverage.problems()) or "none",
        },
    )
