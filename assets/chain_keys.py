"""Which chain an asset belongs to, read from its key: ``digits/training_run`` is the
``training_run`` of the chain named ``digits``; an unprefixed key is the default chain's.

The links are defined once and copied per chain with their keys prefixed
(:func:`assets.chain_assets`), so a link learns its chain from the key it is running as.
"""

from __future__ import annotations

import dagster as dg

from assets._group import CHAIN_GROUP

#: The default chain's name: its keys carry no prefix (the keys of a single-chain location).
DEFAULT_CHAIN = ""


def chain_of(key: dg.AssetKey) -> str:
    """The chain a key belongs to: its prefix, or :data:`DEFAULT_CHAIN`."""
    return key.path[0] if len(key.path) > 1 else DEFAULT_CHAIN


def chain_key(chain: str, name: str) -> dg.AssetKey:
    """The key of link ``name`` in ``chain``."""
    return dg.AssetKey([chain, name] if chain else [name])


def chain_group(chain: str) -> str:
    """The asset group of ``chain``: its name, or today's group for the default chain."""
    return chain or CHAIN_GROUP
