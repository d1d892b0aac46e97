"""Fixtures shared by the whole suite, and the Hypothesis profiles.

Session fixtures are read-only by contract: a staged bundle never changes, so one labelled job
per sample (and one persisted instance with a finished chain run) serves every test that only
reads it. ``HYPOTHESIS_PROFILE=dev`` (``make test-fast``) runs fewer examples.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.helpers.chain import (
    LabelledSamples,
    LineageInstance,
    build_lineage_instance,
    label_samples,
)

settings.register_profile("ci", max_examples=200, deadline=None)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def labelled_samples(tmp_path_factory: pytest.TempPathFactory) -> LabelledSamples:
    """Healthy digits and wine jobs on one local Compute, labelled once per session."""
    return label_samples(tmp_path_factory.mktemp("samples"))


@pytest.fixture(scope="session")
def lineage_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LineageInstance]:
    """A PARTIAL version, its resubmission and two chain runs in a persisted SQLite instance,
    built once per session."""
    yield build_lineage_instance(tmp_path_factory.mktemp("lineage"))
