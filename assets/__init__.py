"""The chain's assets, one module per link: each calls the reader core and returns metadata."""

from assets._group import CHAIN_GROUP
from assets.disjoint_index import disjoint_index
from assets.output_bundle import output_bundle, output_bundle_verifies
from assets.prediction_table import prediction_table
from assets.result_manifest import result_manifest
from assets.training_run import training_run, training_run_asset
from assets.verified_snapshot import verified_snapshot

#: Checks that run on their own (the inline, blocking ones are part of their asset).
CHAIN_CHECKS = [output_bundle_verifies]

CHAIN_ASSETS = [
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
    "disjoint_index",
    "output_bundle",
    "output_bundle_verifies",
    "prediction_table",
    "result_manifest",
    "training_run",
    "verified_snapshot",
]
