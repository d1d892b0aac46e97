"""The code location built from the environment as it is when Dagster loads it, not when
``pipeline.defs.definitions`` was first imported: for a test that sets ``LITHI_*`` variables
and then loads the location in-process (:func:`tests.helpers.graphql.graphql_on`)."""

from __future__ import annotations

import dagster as dg

from pipeline.defs.definitions import build_definitions


@dg.definitions
def defs() -> dg.Definitions:
    """Read the environment now."""
    return build_definitions()
