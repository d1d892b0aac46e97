"""docs/conformance.md is what `lithi-bundle stage` does: every cell staged again and compared."""

from __future__ import annotations

import pytest

from pipeline.bundle import format as fmt
from tests.helpers.conformance import DOC, matrix, render, rows


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """Every cell staged once (raises if one is neither a faithful read nor a clean refusal)."""
    return matrix(tmp_path_factory.mktemp("conformance"))


def test_the_conformance_document_is_what_the_code_does(staged):
    assert DOC.read_text() == render(staged), (
        "docs/conformance.md is out of date: run python -m tests.helpers.conformance"
    )


def test_what_each_format_promises_for_the_v1_types(staged):
    # Independent of the document's wording: Parquet and Arrow IPC read every v1 type, JSON
    # Lines every one but bytes, CSV every scalar but bytes.
    outcomes = {row.label: [outcome for outcome, _ in cells] for row, cells in staged}
    for label in (r.label for r in rows() if r.declared == r.label):
        parquet, ipc, csv, jsonl = outcomes[label]
        assert parquet == ipc == "read", label
        assert jsonl == ("refused" if "binary" in label else "read"), label
        scalar = label in fmt.SCALAR_TYPES and label != "binary"
        assert csv == ("read" if scalar else "refused"), label
