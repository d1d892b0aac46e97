"""The reference trainer: features, model, fit, predict and the record beside a checkpoint.

Pure torch over :mod:`pipeline.readers` (no Dagster), so the same code trains in a Dagster step,
under ``torchrun`` or in a plain script.
"""

from pipeline.training.features import FeatureSpec, feature_columns, fit_spec, holdout_mask
from pipeline.training.fit import TrainConfig, TrainOutcome, TrainSummary, evaluate_model, fit
from pipeline.training.model import Classifier, load_checkpoint, save_checkpoint
from pipeline.training.predict import predict
from pipeline.training.record import TrainingRecord, read_record, write_record

__all__ = [
    "Classifier",
    "FeatureSpec",
    "TrainConfig",
    "TrainOutcome",
    "TrainSummary",
    "TrainingRecord",
    "evaluate_model",
    "feature_columns",
    "fit",
    "fit_spec",
    "holdout_mask",
    "load_checkpoint",
    "predict",
    "read_record",
    "save_checkpoint",
    "write_record",
]
