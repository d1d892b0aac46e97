"""The chain's assets, one module per link: each calls the reader core and returns metadata."""

from assets._group import CHAIN_GROUP
from assets.disjoint_index import disjoint_index
from assets.output_bundle import output_bundle, output_bundle_verifies
from assets.prediction_table import prediction_table
from assets.result_manifest import result_manifest
from assets.training_run import training_run
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

__all__ = [
    "CHAIN_ASSETS",
    "CHAIN_CHECKS",
    "CHAIN_GROUP",
    "disjoint_index",
    "output_bundle",
    "output_bundle_verifies",
    "prediction_table",
    "result_manifest",
    "training_run",
    "verified_snapshot",
]
