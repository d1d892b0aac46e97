"""The digits sample staged for the local Compute's tests, and a labelling job's spec over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from pipeline.bundle.verify import VerifiedSnapshot
from pipeline.defs.samples import stage_sample
from resources.compute.client import JobSpec


class StagedSample(NamedTuple):
    """A sample's input bundle and its labelled reference bundle, staged (read-only)."""

    input: VerifiedSnapshot
    reference: VerifiedSnapshot

    def spec(self, **fields: Any) -> JobSpec:
        """A job labelling the input in parts of 300 rows; ``fields`` are further JobSpec
        fields (faults, an idempotency key, a job id, ...)."""
        return JobSpec(
            input_url=str(self.input.root),
            reference_url=str(self.reference.root),
            rows_per_part=300,
            **fields,
        )


def stage_digits(root: Path) -> StagedSample:
    """The digits sample staged under ``root``."""
    return StagedSample(*stage_sample("digits", root))
