"""``training_run``: a torch model trained on the disjoint index, with a record beside it.

The record names the exact data (snapshot identity, index digest) that produced the checkpoint,
so the checkpoint can be reproduced rather than only re-attempted.
"""

import json
import os
import sys
from pathlib import Path

import dagster as dg
import pydantic

from assets import _charts as charts
from assets import _metadata as md
from assets._group import CHAIN_GROUP, IO_MANAGER_KEY
from pipeline.readers.index import Index
from pipeline.training.fit import TrainConfig, TrainSummary, fit
from pipeline.training.model import save_checkpoint
from pipeline.training.record import TrainedModel, TrainingRecord, record_text, write_record
from resources.artifacts import ArtifactStore
from resources.dagster_resources import BundleStoreResource
from resources.settings import ChainSettings

RECONCILES = "iterated_counts_reconcile"
CHECKPOINT = "model.pt"
OUTCOME = "outcome.json"

#: The run config of ``training_run``: the trainer's own config model, field for field (Dagster
#: validates it at launch), except ``num_workers``, which comes from ``ChainSettings``.
TrainingConfig: type[dg.Config] = pydantic.create_model(
    "TrainingConfig",
    __base__=dg.Config,
    __doc__=TrainConfig.__doc__,
    **{n: (f.annotation, f) for n, f in TrainConfig.model_fields.items() if n != "num_workers"},
)


def _train_in_process(index: Index, config: TrainConfig, out: Path, log) -> TrainSummary:
    outcome = fit(index, config, rank=0, world_size=1, log=log)
    digest = save_checkpoint(
        out / CHECKPOINT,
        state_dict=outcome.state_dict,
        spec=outcome.spec,
        config=config.model_dump(),
        hidden=config.hidden,
    )
    return TrainSummary.of(outcome, digest, 1)


def _train_torchrun(
    context: dg.AssetExecutionContext,
    pipes: dg.PipesSubprocessClient,
    index: Index,
    cache_dir: Path,
    config: TrainConfig,
    world: int,
    out: Path,
) -> tuple[TrainSummary, dict]:
    """Train with ``world`` real torchrun ranks; each verifies the bundle with the cache's trust
    and rebuilds the index, which must have the digest this step was handed."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(world), "-m", "pipeline.defs.train_launch",
        "--bundle", str(index.snapshot.root), "--cache-dir", str(cache_dir),
        "--index-sha256", index.digest, "--config", config.model_dump_json(), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    invocation = pipes.run(command=cmd, context=context, env=env)
    reported: dict = {}
    for result in invocation.get_results():
        reported.update({f"pipes/{k}": v for k, v in (result.metadata or {}).items()})
    return TrainSummary.model_validate_json((out / OUTCOME).read_text()), reported


@dg.asset(
    group_name=CHAIN_GROUP,
    io_manager_key=IO_MANAGER_KEY,
    kinds={"pytorch"},
    code_version="2",
    check_specs=[
        dg.AssetCheckSpec(
            RECONCILES,
            asset="training_run",
            description="Items iterated equal the manifest's, by status (accepted, failed, "
            "abstained), with no id seen twice; outstanding items are carried in the report.",
        )
    ],
)
def training_run(
    context: dg.AssetExecutionContext,
    config: TrainingConfig,
    disjoint_index: Index,
    chain_settings: ChainSettings,
    artifacts: ArtifactStore,
    bundle_store: BundleStoreResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
):
    """A classifier trained on your hardware from the disjoint index: accepted rows, weighted
    by confidence (both configurable). world_size 1 trains in the step's process; more ranks run
    as real torchrun processes through Dagster Pipes. The checkpoint's folder holds, beside it, a
    record of the training snapshot, index digest, config and metrics, written once."""
    train_config = TrainConfig(**config.model_dump(), num_workers=chain_settings.num_workers)
    out = artifacts.directory(context)
    world = chain_settings.world_size
    index = disjoint_index
    reported: dict = {}
    if world == 1:
        summary = _train_in_process(index, train_config, out, context.log.info)
    else:
        summary, reported = _train_torchrun(
            context,
            pipes_subprocess_client,
            index,
            bundle_store.store().cache_dir,
            train_config,
            world,
            out,
        )
    report = summary.reconciliation
    record = TrainingRecord(
        snapshot=index.snapshot.identity,
        index_sha256=index.digest,
        config=train_config.model_dump(),
        world_size=world,
        checkpoint_file=CHECKPOINT,
        checkpoint_sha256=summary.checkpoint_sha256,
        metrics=summary.metrics,
        loss_curve=summary.loss_curve,
        reconciliation=report,
    )
    record_path = write_record(out, record)
    svg = charts.loss_svg(summary.loss_curve, out / "loss.svg")
    yield dg.AssetCheckResult(
        check_name=RECONCILES,
        passed=report.ok,
        metadata={k: v for k, v in report.as_dict().items() if isinstance(v, int | float | str)},
    )
    yield dg.Output(
        TrainedModel(index, out, record),
        metadata={
            **md.identity("snapshot", index.snapshot.identity),
            "index_sha256": index.digest,
            "checkpoint_sha256": summary.checkpoint_sha256,
            "checkpoint": dg.MetadataValue.path(str(out / CHECKPOINT)),
            "record": dg.MetadataValue.path(str(record_path)),
            "record_json": dg.MetadataValue.json(json.loads(record_text(record))),
            "loss_curve_chart": dg.MetadataValue.md(charts.svg_markdown(svg)),
            "loss_curve": dg.MetadataValue.md(charts.loss_markdown(summary.loss_curve)),
            "loss_curve_svg": dg.MetadataValue.path(str(svg)),
            "final_loss": float(summary.loss_curve[-1]),
            "holdout_accuracy": float(summary.metrics["holdout_accuracy"]),
            "train_accuracy": float(summary.metrics["train_accuracy"]),
            "world_size": world,
            "items_iterated": report.items_iterated,
            **reported,
        },
        data_version=dg.DataVersion(summary.checkpoint_sha256),
    )
