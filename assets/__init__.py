"""The chain's assets, one module per link: each calls the reader core and returns metadata."""

from assets._group import CHAIN_GROUP
from assets.compute_versions import compute_versions
from assets.disjoint_index import disjoint_index, index_disjoint_and_covering
from assets.output_bundle import output_bundle, output_bundle_verifies
from assets.prediction_table import one_row_per_item, prediction_table
from assets.result_manifest import result_manifest
from assets.training_run import iterated_counts_reconcile, training_run, training_run_asset
from assets.verified_snapshot import manifest_binds_every_file, verified_snapshot

#: The checks that can run on their own (in a chain run they follow their asset; the blocking
#: ones stop what is downstream). result_manifest_complete is inline: it judges the run config.
CHAIN_CHECKS = [
    manifest_binds_every_file,
    index_disjoint_and_covering,
    iterated_counts_reconcile,
    one_row_per_item,
    output_bundle_verifies,
]

CHAIN_ASSETS = [
    compute_versions,
    result_manifest,
    verified_snapshot,
    disjoint_index,
    training_run,
    prediction_table,
    output_bundle,
]


def chain_assets(trainer: str | None = None, defaults: dict | None = None) -> list:
    """The six links, with ``training_run`` built for ``trainer`` (an import path) and its
    config ``defaults``; without arguments, the reference trainer's chain (``CHAIN_ASSETS``)."""
    if trainer is None and not defaults:
        return list(CHAIN_ASSETS)
    run = training_run_asset(*(() if trainer is None else (trainer,)), defaults)
    return [run if a is training_run else a for a in CHAIN_ASSETS]


__all__ = [
    "CHAIN_ASSETS",
    "CHAIN_CHECKS",
    "CHAIN_GROUP",
    "chain_assets",
    "compute_versions",
    "disjoint_index",
    "output_bundle",
    "output_bundle_verifies",
    "prediction_table",
    "result_manifest",
    "training_run",
    "verified_snapshot",
]
