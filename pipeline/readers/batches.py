"""What to do with a dict batch: collate it, select rows, and read its ``lithi_*`` columns.

The readers yield dict batches (see :mod:`pipeline.readers.tensors`); these helpers are how
training code filters and weights them honestly by ``lithi_status`` and ``lithi_confidence``
without dropping identity: every column and mask is selected alike.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipeline.bundle import format as fmt
from pipeline.readers.tensors import VALID_SUFFIX, Batch


class Row(dict):
    """One row as a sample (what ``MapDataset.__getitem__`` returns): a dict of its values.

    It also names its variable-length ``list<T>`` columns (``ragged``), so :func:`collate_batches`
    keeps them as lists of 1-D tensors even when every row in a batch happens to have the same
    length; a batch's types then depend on the schema alone, never on the data.
    """

    def __init__(self, values: dict[str, Any], ragged: frozenset[str] = frozenset()) -> None:
        super().__init__(values)
        self.ragged = ragged

    def __reduce__(self) -> tuple[Any, ...]:  # a DataLoader worker pickles rows to main
        return (Row, (dict(self), self.ragged))


def collate_batches(batch: Any) -> Any:
    """A ``collate_fn`` that passes built dict batches through and stacks per-row samples.

    A dict (from ``__getitems__`` or an iterable batch) is returned as is. A list of per-row
    dicts (from ``__getitem__``, e.g. through ``ConcatDataset``) becomes one batch, even of one
    row: scalars and fixed-size vectors are stacked to ``[B]`` / ``[B, N]`` tensors; strings,
    bytes, lists of them and ``None`` stay Python lists (an id is never split into characters);
    the variable-length columns a :class:`Row` names stay lists of 1-D tensors. Tensors of
    differing shapes in a plain dict are kept as a list rather than refused.
    """
    if isinstance(batch, dict):
        return batch
    if isinstance(batch, (list, tuple)) and batch and all(isinstance(r, dict) for r in batch):
        ragged: frozenset[str] = getattr(batch[0], "ragged", frozenset())
        out: dict[str, Any] = {}
        for key in batch[0]:
            values = [row[key] for row in batch]
            if (
                key not in ragged
                and all(isinstance(v, torch.Tensor) for v in values)
                and _same_shape(values)
            ):
                out[key] = torch.stack(values)
            else:
                out[key] = values
        return out
    raise TypeError(
        f"collate_batches expects a dict batch or a list of dict rows, got {batch!r:.80}"
    )


def _same_shape(ts: list[torch.Tensor]) -> bool:
    return all(t.shape == ts[0].shape for t in ts)


def select_rows(batch: Batch, rows: torch.Tensor | np.ndarray | Sequence[int]) -> Batch:
    """The batch restricted to ``rows`` (positions), every column and mask alike."""
    idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    picked = idx.tolist()
    out: Batch = {}
    for k, v in batch.items():
        out[k] = v.index_select(0, idx) if isinstance(v, torch.Tensor) else [v[i] for i in picked]
    return out


def accepted_mask(batch: Mapping[str, Any]) -> torch.Tensor:
    """A bool tensor ``[B]``: which rows have ``lithi_status == "accepted"``."""
    status = batch.get(fmt.STATUS_COLUMN)
    if status is None:
        raise KeyError(f"batch has no {fmt.STATUS_COLUMN!r}: only result bundles have statuses")
    if isinstance(status, list):  # as the readers hand strings over: compared in one C loop
        flags = np.fromiter(
            map(operator.eq, status, itertools.repeat("accepted")), np.bool_, count=len(status)
        )
    else:
        flags = np.asarray(np.array(status, dtype=object) == "accepted", dtype=np.bool_)
    return torch.from_numpy(flags.reshape(len(status)))


def accepted_only(batch: Batch) -> Batch:
    """The batch's rows with ``lithi_status == "accepted"`` (failed and abstained dropped)."""
    return select_rows(batch, torch.nonzero(accepted_mask(batch)).flatten())


def confidence_weights(batch: Batch) -> torch.Tensor:
    """Per-row float32 weights from ``lithi_confidence``: the confidence, 0 where it is null."""
    conf = batch.get(fmt.CONFIDENCE_COLUMN)
    if conf is None:
        raise KeyError(f"batch has no {fmt.CONFIDENCE_COLUMN!r}: only result bundles have it")
    valid = batch.get(fmt.CONFIDENCE_COLUMN + VALID_SUFFIX)
    if not isinstance(conf, torch.Tensor) or not isinstance(valid, torch.Tensor | None):
        raise TypeError(f"{fmt.CONFIDENCE_COLUMN!r} in a batch is a float32 tensor (and its mask)")
    conf = conf.to(torch.float32)
    if valid is None:
        valid = ~torch.isnan(conf)
    return torch.where(valid, conf, torch.zeros_like(conf))
