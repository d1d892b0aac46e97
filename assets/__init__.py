"""The chain's assets, one module per link: each calls the reader core and returns metadata."""

import dagster as dg

from assets._group import CHAIN_GROUP
from assets.chain_keys import DEFAULT_CHAIN, chain_group, chain_key, chain_of
from assets.compute_versions import compute_versions, compute_versions_asset
from assets.disjoint_index import disjoint_index, index_disjoint_and_covering
from assets.model_currency import model_is_current
from assets.output_bundle import output_bundle, output_bundle_verifies
from assets.prediction_table import one_row_per_item, prediction_table
from assets.result_manifest import result_manifest
from assets.training_run import iterated_counts_reconcile, training_run, training_run_asset
from assets.verified_snapshot import manifest_binds_every_file, verified_snapshot
from pipeline.training.trainer import REFERENCE_TRAINER

#: The checks that can run on their own (in a chain run they follow their asset; the blocking
#: ones stop what is downstream). result_manifest_complete is inline: it judges the run config.
CHAIN_CHECKS = [
    manifest_binds_every_file,
    index_disjoint_and_covering,
    iterated_counts_reconcile,
    model_is_current,
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


def chain_assets(
    trainer: str | None = None, defaults: dict | None = None, chain: str = DEFAULT_CHAIN
) -> list[dg.AssetsDefinition | dg.SourceAsset]:
    """The six links (and the versions they start from), with ``training_run`` built for
    ``trainer`` (an import path) and its config ``defaults``; without arguments, the reference
    trainer's chain (``CHAIN_ASSETS``). A named ``chain`` has every key under its name
    (``digits/training_run``) and its own group; the default chain keeps the plain keys."""
    if chain == DEFAULT_CHAIN:
        if trainer is None and not defaults:
            return list(CHAIN_ASSETS)
        run = training_run_asset(*(() if trainer is None else (trainer,)), defaults)
        return [run if a is training_run else a for a in CHAIN_ASSETS]
    keys = _renamed(chain)
    group = chain_group(chain)
    # each chain's training_run is its own op (its config differs); the other links are the
    # same ops under new keys
    run = training_run_asset(trainer or REFERENCE_TRAINER, defaults, chain)
    return [
        compute_versions_asset(keys[a.key], group)
        if isinstance(a, dg.SourceAsset)
        else run.with_attributes(asset_key_replacements=keys)
        if a is training_run
        # with_attributes will not move an asset to another group: the specs are mapped
        else a.with_attributes(asset_key_replacements=keys).map_asset_specs(
            lambda spec: spec.replace_attributes(group_name=group)
        )
        for a in CHAIN_ASSETS
    ]


def chain_checks(chain: str = DEFAULT_CHAIN) -> list[dg.AssetChecksDefinition]:
    """The checks that can run on their own (``CHAIN_CHECKS``), on ``chain``'s keys."""
    if chain == DEFAULT_CHAIN:
        return list(CHAIN_CHECKS)
    keys = _renamed(chain)
    return [c.with_attributes(asset_key_replacements=keys) for c in CHAIN_CHECKS]


def _renamed(chain: str) -> dict[dg.AssetKey, dg.AssetKey]:
    """Every key of the default chain, mapped to its key in ``chain``."""
    keys = [k for a in CHAIN_ASSETS for k in ([a.key] if isinstance(a, dg.SourceAsset) else a.keys)]
    return {k: chain_key(chain, k.to_user_string()) for k in keys}


__all__ = [
    "CHAIN_ASSETS",
    "CHAIN_CHECKS",
    "CHAIN_GROUP",
    "DEFAULT_CHAIN",
    "chain_assets",
    "chain_checks",
    "chain_group",
    "chain_key",
    "chain_of",
    "compute_versions",
    "disjoint_index",
    "output_bundle",
    "output_bundle_verifies",
    "prediction_table",
    "result_manifest",
    "training_run",
    "verified_snapshot",
]
