"""The reference trainer's config: what to predict from what, how hard to train, and the
check that refuses a config that cannot work on a bundle's schema before any work."""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import Schema, SchemaField
from pipeline.training.columns import Task, check_label, choose_features
from pipeline.training.trainer import FeatureSet


class ReferenceConfig(BaseModel):
    """The reference trainer's config: what to predict from what, and how hard to train."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: Task = Field(default="classification", description="classification or regression")
    label: str = Field(default=fmt.LABEL_COLUMN, description="the target column")
    features: list[str] = Field(default=[], description="the feature columns, in order")
    auto_features: bool = Field(
        default=False, description="use every numeric declared column instead (recorded)"
    )
    exclude: list[str] = Field(default=[], description="columns auto_features must not use")
    epochs: int = Field(default=12, ge=1)
    batch_size: int = Field(default=64, ge=1)
    learning_rate: float = Field(default=3e-3, gt=0)
    hidden: int = Field(default=128, ge=1)
    seed: int = 0
    reader: Literal["map", "iterable"] = "map"
    mix: bool = Field(
        default=False,
        description="mix parts across ranks and within batches each epoch (docs/readers.md)",
    )
    accepted_only: bool = Field(default=True, description="train on accepted rows only")
    weight_by_confidence: bool = Field(default=True, description="weight rows by confidence")
    holdout_percent: int = Field(default=20, ge=0, lt=100)
    amp: bool = Field(
        default=False, description="bfloat16 autocast for the forward pass and loss (GPU speed)"
    )
    flush_denormals: bool = Field(
        default=True,
        description="on the CPU, treat float32 values below 1.2e-38 as zero during the fit "
        "(FTZ/DAZ): long fits otherwise slow down as Adam's moments decay into them",
    )
    host_allreduce: bool = Field(
        default=True,
        description="ranks on one host's CPU average their gradients through shared memory "
        "instead of gloo's loopback TCP (x86-64 Linux; elsewhere gloo, as off)",
    )
    one_hot_max: int = Field(
        default=16,
        ge=0,
        description="a string feature with at most this many values is one-hot encoded; one "
        "with more is embedded",
    )
    max_categories: int = Field(
        default=10_000,
        ge=1,
        # an embedded code travels in the float32 input: exact far beyond this
        le=1_000_000,
        description="values kept per string feature, the most frequent (ties by value); the "
        "rest count as unseen",
    )
    missing: Literal["fill", "drop", "refuse"] = Field(
        default="fill",
        description="a row missing a feature value (null, NaN): filled (a number with its "
        "training mean, a category with none) beside a validity indicator; dropped (neither "
        "trained on nor scored, predicted as null); or refused (the fit stops, naming the column)",
    )

    def choose_features(
        self, schema: Schema | pa.Schema, id_field: str
    ) -> tuple[list[SchemaField], FeatureSet]:
        """The feature columns this config names (or, with ``auto_features``, every usable one
        but ``exclude``) in ``schema``, and what to record: ``columns.choose_features``."""
        return choose_features(
            schema,
            id_field=id_field,
            label=self.label,
            features=self.features,
            auto=self.auto_features,
            exclude=self.exclude,
        )


#: Config fields added after checkpoints were first written, left out of a checkpoint while at
#: their default: a fit trained as before then writes the same bytes (and digest) as before.
_LATER_FIELDS = {
    "amp": False,
    "mix": False,
    "one_hot_max": 16,
    "max_categories": 10_000,
    "missing": "fill",
    "flush_denormals": True,
    "host_allreduce": True,
}


def checkpoint_config(config: ReferenceConfig) -> dict:
    """The config as the checkpoint stores it (see :data:`_LATER_FIELDS`)."""
    data = config.model_dump()
    for name, default in _LATER_FIELDS.items():
        if data.get(name) == default:
            del data[name]
    return data


def check_config(
    config: ReferenceConfig, schema: Schema | pa.Schema, id_field: str
) -> tuple[list[SchemaField], FeatureSet]:
    """Refuse a config that cannot work on ``schema`` before any work; else the feature fields.

    ``schema`` is a bundle manifest's, or an Arrow schema (a table about to be staged). A
    label or feature that is not a column, or is of a type the trainer cannot take (a list of
    strings, a nested struct), is one :class:`TrainerError` line naming the column, its type
    and what would work. Returns what :meth:`ReferenceConfig.choose_features` does.
    """
    check_label(schema, config.label, config.task)
    return config.choose_features(schema, id_field)
