"""Arrow columns to torch batches, with every dtype taken from the declared schema.

The declared vocabulary type of a column — never the data, a filename or the first file —
decides what a batch holds; ``docs/readers.md`` has the table (strings stay ``list[str]``, fixed
size lists become 2-D tensors, unsigned types widen losslessly, ``uint64`` above ``2**63-1`` is
refused). A nullable column other than strings, binary and ``list<T>`` also gets a
``<name>__valid`` mask, present whether or not this batch holds a null, so a batch's keys depend
on the schema alone. Numeric tensors share fresh Arrow buffers where no conversion is needed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from pipeline.bundle.manifest import Schema, SchemaField

VALID_SUFFIX = "__valid"

Batch = dict[str, "torch.Tensor | list"]

_TORCH = {
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.int32,
    "uint32": torch.int64,
    "uint64": torch.int64,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "date32": torch.int32,
    "timestamp[us,UTC]": torch.int64,
}
_NUMPY_VIEW = {"date32": np.int32, "timestamp[us,UTC]": np.int64}
_INT64_MAX = 2**63 - 1


class ValueOverflow(ValueError):
    """A uint64 value does not fit the int64 tensor its column maps to."""


def _element(type_name: str) -> str:
    return type_name[type_name.index("<") + 1 : type_name.rindex(">")].split(",")[0]


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    # Arrow buffers are immutable, so numpy views of them are read-only; the batch is the only
    # holder of these fresh buffers, so sharing them with torch is safe.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def _scalars(arr: pa.Array, type_name: str, name: str) -> torch.Tensor:
    """A flat numeric/bool/date/timestamp Arrow array (nulls filled) as a 1-D tensor."""
    if arr.null_count:
        fill = (
            float("nan") if type_name.startswith("float") else (False if type_name == "bool" else 0)
        )
        arr = pc.fill_null(arr, pa.scalar(fill, arr.type))
    if type_name in _NUMPY_VIEW:  # dates and timestamps as their integer storage
        arr = arr.view(pa.int32() if type_name == "date32" else pa.int64())
    if type_name == "uint64" and len(arr):
        top = pc.max(arr).as_py()
        if top is not None and top > _INT64_MAX:
            raise ValueOverflow(
                f"column {name!r} (uint64) holds {top}, above int64's {_INT64_MAX}; "
                "torch has no full uint64 tensor, so the value cannot be kept exactly"
            )
    np_arr = arr.to_numpy(zero_copy_only=False)
    want = _TORCH[type_name]
    t = _from_numpy(np_arr)
    return t if t.dtype == want else t.to(want)


def column_to_torch(col: pa.Array | pa.ChunkedArray, f: SchemaField) -> dict[str, object]:
    """Convert one column to its declared batch form: ``{name: value[, name__valid: mask]}``."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = f.type
    out: dict[str, object] = {}
    if t in ("string", "binary"):
        out[f.name] = arr.to_pylist()
        return out
    if t.startswith("fixed_size_list<"):
        n = arr.type.list_size
        # a null row is filled like a null scalar (NaN for floats, 0/False otherwise); its slot
        # in the child array may hold anything, so it is replaced, not trusted
        values = (
            pc.list_flatten(pc.fill_null(arr, _null_fill_list(arr.type)))
            if arr.null_count
            else arr.flatten()
        )
        flat = _scalars(values, _element(t), f.name)
        out[f.name] = flat.reshape(len(arr), n)
    elif t.startswith("list<"):
        elem = _element(t)
        flat = _scalars(arr.flatten(), elem, f.name)
        offsets = arr.offsets.to_numpy()
        lengths = np.diff(offsets)
        out[f.name] = list(torch.split(flat, lengths.tolist())) if len(arr) else []
        return out  # an empty tensor stands for a null list; nothing else to mask
    else:
        out[f.name] = _scalars(arr, t, f.name)
    if f.nullable:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        out[f.name + VALID_SUFFIX] = torch.from_numpy(np.ascontiguousarray(valid, dtype=np.bool_))
    return out


def _null_fill_list(list_type: pa.FixedSizeListType) -> pa.Scalar:
    value_type = list_type.value_type
    fill: float | int | bool = 0
    if pa.types.is_floating(value_type):
        fill = float("nan")
    elif pa.types.is_boolean(value_type):
        fill = False
    return pa.scalar([fill] * list_type.list_size, list_type)


def to_batch(
    data: pa.Table | pa.RecordBatch, schema: Schema, columns: Iterable[str] | None = None
) -> Batch:
    """Convert a table or record batch to a dict batch typed by the declared ``schema``.

    ``columns`` (default: every column of ``data``) must all be declared; a column whose Arrow
    type differs from its declaration is refused rather than silently converted.
    """
    names = list(columns) if columns is not None else list(data.schema.names)
    batch: Batch = {}
    for name in names:
        f = schema.field(name)
        col = data.column(name)
        if col.type != f.arrow_type:
            raise TypeError(
                f"column {name!r}: declared {f.type} ({f.arrow_type}), found Arrow {col.type}"
            )
        batch.update(column_to_torch(col, f))
    return batch
