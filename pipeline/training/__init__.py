"""Training: the trainer interface, the pipeline's side of a run, and the reference trainer.

Pure torch over :mod:`pipeline.readers` (no Dagster), so the same trainer runs in a Dagster step,
under ``torchrun`` or in a plain script. Write your own by subclassing :class:`Trainer`.
"""

from pipeline.training.device import (
    DeviceError,
    choose_device,
    cpu_state_dict,
    process_group_backend,
    to_device,
)
from pipeline.training.record import OutputRecord, TrainedModel, TrainingRecord, read_record
from pipeline.training.runner import (
    CheckpointFiles,
    TrainSummary,
    hash_checkpoint,
    run_fit,
    train_once,
)
from pipeline.training.trainer import (
    REFERENCE_TRAINER,
    FeatureSet,
    FitContext,
    FitResult,
    PredictContext,
    TalliedLoader,
    Trainer,
    TrainerError,
    TrainerInfo,
    load_trainer,
    trainer_info,
)

__all__ = [
    "REFERENCE_TRAINER",
    "CheckpointFiles",
    "DeviceError",
    "FeatureSet",
    "FitContext",
    "FitResult",
    "OutputRecord",
    "PredictContext",
    "TalliedLoader",
    "TrainSummary",
    "TrainedModel",
    "Trainer",
    "TrainerError",
    "TrainerInfo",
    "TrainingRecord",
    "choose_device",
    "cpu_state_dict",
    "hash_checkpoint",
    "load_trainer",
    "process_group_backend",
    "read_record",
    "run_fit",
    "to_device",
    "train_once",
    "trainer_info",
]
