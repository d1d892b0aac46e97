"""A verified snapshot to torch batches: the index, the disjoint split, the readers, reconcile.

Built on :mod:`pipeline.bundle` and torch only (no Dagster). A training script needs no more than
``index = Index.from_snapshot(verify(path))`` and :func:`make_loader` (or the datasets with
torch's own ``DataLoader``); every item then has exactly one owner across ranks and workers.
"""

from pipeline.readers.batches import (
    Row,
    accepted_mask,
    accepted_only,
    collate_batches,
    confidence_weights,
    select_rows,
)
from pipeline.readers.derive import Derive
from pipeline.readers.index import Index, IndexMismatch
from pipeline.readers.iterable import IdleOwnerWarning, PartIterableDataset
from pipeline.readers.loader import ReaderLoader, make_loader, set_epoch
from pipeline.readers.map_style import MapDataset
from pipeline.readers.owner import NoProcessGroupWarning, Owner, SplitMismatch, process_rank
from pipeline.readers.reconcile import (
    OwnerCounts,
    ReconcileError,
    ReconcileReport,
    Tally,
    reconcile,
    reconcile_distributed,
)
from pipeline.readers.resume import ResumeMismatch, merge_states
from pipeline.readers.sampler import OwnerSampler
from pipeline.readers.split import SplitPlan, plan_split
from pipeline.readers.tensors import (
    POSITION_KEY,
    VALID_SUFFIX,
    Batch,
    UnreadableType,
    ValueOverflow,
    to_batch,
)

__all__ = [
    "POSITION_KEY",
    "VALID_SUFFIX",
    "Batch",
    "Derive",
    "IdleOwnerWarning",
    "Index",
    "IndexMismatch",
    "MapDataset",
    "NoProcessGroupWarning",
    "Owner",
    "OwnerCounts",
    "OwnerSampler",
    "PartIterableDataset",
    "ReconcileError",
    "ReconcileReport",
    "ReaderLoader",
    "ResumeMismatch",
    "Row",
    "SplitMismatch",
    "SplitPlan",
    "Tally",
    "UnreadableType",
    "ValueOverflow",
    "accepted_mask",
    "accepted_only",
    "collate_batches",
    "confidence_weights",
    "make_loader",
    "merge_states",
    "plan_split",
    "process_rank",
    "reconcile",
    "reconcile_distributed",
    "select_rows",
    "set_epoch",
    "to_batch",
]
