"""Tensors computed from each batch where it is read: in the DataLoader workers, if any.

A training loop that turns every batch into the same tensors (features, targets, row weights)
pays for that in the main process, which also steps the model; the workers that read the batch
sit idle most of an epoch. A *derive* function given to the loader
(:meth:`~pipeline.readers.loader.ReaderLoader.set_derive`) runs where the batch is read
instead, like a ``collate_fn``: on each worker message, before it is sent. Its tensors take the
place of the columns read; what every batch carries stays (the id, the ``lithi_*`` columns and
each row's index position), so counting and reconciling a pass are unchanged.

A pass that only sums (a fitting pass's statistics) has no use for per-row tensors: its derive
returns a :class:`Summary` of the whole message instead, which is all that crosses to the main
process beside what every batch carries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from pipeline.bundle.format import LITHI_PREFIX, VALID_SUFFIX
from pipeline.readers.tensors import POSITION_KEY, Wire, finish_value


class Summary:
    """What a derive computed from a whole worker message rather than row by row (a partial
    sum, say), under its name in the batch: any picklable value, handed over as it is.

    It cannot be cut into batches, so a loader that derives one must hand over whole messages
    (:meth:`~pipeline.readers.loader.ReaderLoader.set_batch_size` at ``message_rows``); one
    that would cut such a message refuses.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Summary({self.value!r})"


#: A function of one batch (a mapping of its columns, finished as the loop would see them) to
#: what replaces its columns: CPU tensors of one row per row of the batch, or a
#: :class:`Summary` of the whole batch.
Derive = Callable[[Mapping[str, Any]], Mapping[str, "torch.Tensor | Summary"]]


class _Finished(Mapping[str, Any]):
    """A wire batch seen as the loop's batch, each column finished only when looked up: a
    derive that needs three columns does not pay for turning the ids into Python strings."""

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._done: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._done:
            self._done[key] = finish_value(self._wire[key])
        return self._done[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._wire)

    def __len__(self) -> int:
        return len(self._wire)


def carried(name: str, id_field: str) -> bool:
    """Whether every batch carries ``name`` whatever a derive returns: the id, the ``lithi_*``
    columns (with their validity masks) and the rows' index positions."""
    if name == POSITION_KEY:
        return True
    base = name.removesuffix(VALID_SUFFIX)
    return base == id_field or base.startswith(LITHI_PREFIX)


def derived_wire(wire: Wire, derive: Derive, id_field: str) -> Wire:
    """``wire`` with ``derive``'s tensors in place of its columns, the carried ones kept."""
    rows = len(wire[POSITION_KEY]) if POSITION_KEY in wire else None
    out = Wire({k: v for k, v in wire.items() if carried(k, id_field)})
    for name, value in derive(_Finished(wire)).items():
        if name in out:
            raise ValueError(
                f"derive returned {name!r}, a column every batch carries; name it otherwise"
            )
        if isinstance(value, Summary):  # of the whole message: no rows to check
            out[name] = value
            continue
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            raise TypeError(
                f"derive returned {name!r} as {type(value).__name__}"
                f"{'' if not isinstance(value, torch.Tensor) else ' on ' + str(value.device)}"
                ": a CPU tensor (the loop moves it to its device) or a Summary is expected"
            )
        if rows is not None and (value.dim() == 0 or value.shape[0] != rows):
            raise ValueError(
                f"derive returned {name!r} of shape {tuple(value.shape)}: one row per row of "
                f"the batch ({rows}) is expected, so batches can be cut from it"
            )
        try:
            out[name] = np.ascontiguousarray(value.detach().numpy())
        except TypeError as e:  # a dtype numpy lacks (bfloat16): it could not cross the pipe
            raise TypeError(f"derive returned {name!r} as {value.dtype}: {e}") from None
    return out
