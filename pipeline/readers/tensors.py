"""Arrow columns to torch batches, with every dtype taken from the declared schema.

The declared vocabulary type of a column — never the data, a filename or the first file —
decides what a batch holds; ``docs/readers.md`` has the table (strings stay ``list[str]``, lists
of strings or bytes stay Python lists per row, fixed size lists of numbers become 2-D tensors,
unsigned types widen losslessly, ``uint64`` above ``2**63-1`` is refused). A nullable column
whose values become tensors, other than ``list<T>``, also gets a ``<name>__valid`` mask, present
whether or not this batch holds a null, so a batch's keys depend on the schema alone; where values
stay Python objects a null is ``None``. Numeric tensors share fresh Arrow buffers where no
conversion is needed. :func:`check_readable` is the one place that says which declared types a
batch can hold; every reader runs it when it is built.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from pipeline.bundle.format import SCALAR_TYPES, VALID_SUFFIX, UnknownType
from pipeline.bundle.manifest import Schema, SchemaField

Batch = dict[str, "torch.Tensor | list"]

#: The key under which every batch a reader yields carries each row's place in the index (an
#: ``int64`` tensor): what hold-out membership and the pipeline's tally of a pass look rows up
#: by, so neither hashes nor copies an id per row. No declared column may take this name.
POSITION_KEY = "__position"

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
#: Element types a batch keeps as Python objects: ``str``/``bytes`` for a scalar, a Python list
#: per row for a list or fixed-size list of them; ``None`` where null, so no mask.
PYTHON_TYPES = ("string", "binary")
_NUMPY_VIEW = {"date32": np.int32, "timestamp[us,UTC]": np.int64}
#: the numpy dtype of each batch dtype above (what a wire batch carries)
_NUMPY = {k: torch.empty(0, dtype=v).numpy().dtype for k, v in _TORCH.items()}
_INT64_MAX = 2**63 - 1


class ValueOverflow(ValueError):
    """A uint64 value does not fit the int64 tensor its column maps to."""


class UnreadableType(TypeError):
    """A declared column type no batch form exists for: refused when a reader is built."""


def check_readable(schema: Schema, columns: Iterable[str]) -> None:
    """Refuse, in one line naming the column and its type, any of ``columns`` no batch can hold.

    Every v1 type has a batch form; this keeps it so. A type added to the vocabulary without
    one is refused here, when a reader is built, instead of failing on a lookup in the middle
    of an epoch (``tests/readers/test_every_v1_type.py`` checks every type passes).
    """
    for name in columns:
        if name == POSITION_KEY:
            raise UnreadableType(
                f"column {name!r}: the readers put each row's index position under this key; "
                "rename the column"
            )
        f = schema.field(name)
        try:
            element: str | None = f.element
        except UnknownType:
            element = None
        if element not in _TORCH and element not in PYTHON_TYPES:
            raise UnreadableType(
                f"column {name!r}: type {f.type} has no batch form; the readers convert "
                f"{', '.join(SCALAR_TYPES)} and list<T> and fixed_size_list<T,N> of them"
            )


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    # Arrow buffers are immutable, so numpy views of them are read-only; the batch is the only
    # holder of these fresh buffers, so sharing them with torch is safe.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def _scalars(arr: pa.Array, type_name: str, name: str) -> np.ndarray:
    """A flat numeric/bool/date/timestamp Arrow array (nulls filled) as 1-D numpy of the
    declared batch dtype (zero-copy where no fill or widening is needed)."""
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
    want = _NUMPY[type_name]
    if np_arr.dtype == want:
        return np_arr
    if type_name == "uint64":  # checked above: every value fits, so the bits are the value
        return np_arr.view(np.int64)
    return np_arr.astype(want)


class Wire(dict):
    """A batch on its way from a DataLoader worker to the main process (``name -> array``).

    Numeric columns and masks are numpy arrays of their final dtype, numeric ``list<T>`` its
    values and lengths (:class:`Ragged`), and strings and binary, and lists of them, stay Arrow
    arrays: all pickle as flat buffers, while torch tensors would each cost a new shared-memory
    segment and Python strings an object each, on both sides. The main process finishes it with
    :func:`wire_to_batch`, the same conversion ``to_batch`` does.
    """


def column_to_wire(col: pa.Array | pa.ChunkedArray, f: SchemaField) -> dict[str, object]:
    """Convert one column to its wire form: ``{name: array[, name__valid: bool array]}``."""
    if isinstance(col, pa.ChunkedArray):  # one chunk: a zero-copy slice, not a copy
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    t = f.type
    out: dict[str, object] = {}
    if f.element in PYTHON_TYPES:
        if pa.types.is_dictionary(arr.type):  # read dictionary-encoded: see Coded
            out[f.name] = _coded(arr)
        else:
            # to Python lists in wire_to_batch: a str/bytes per row, or for a list or fixed-size
            # list of them a list per row, None for a null row or element (so no mask)
            out[f.name] = _own_buffers(arr)
        return out
    if f.is_list:  # values and lengths; a null list is an empty one
        flat = _scalars(arr.flatten(), f.element, f.name)
        # lengths as flatten() counts them: a null row may cover values in the child array,
        # which flatten() skips and the raw offsets would count
        lengths = pc.list_value_length(arr)
        if lengths.null_count:
            lengths = pc.fill_null(lengths, 0)
        out[f.name] = Ragged(flat, lengths.to_numpy(zero_copy_only=False))
        return out
    if f.is_fixed_size_list:
        n = arr.type.list_size
        # a null row is filled like a null scalar (NaN for floats, 0/False otherwise); its slot
        # in the child array may hold anything, so it is replaced, not trusted
        values = (
            pc.list_flatten(pc.fill_null(arr, _null_fill_list(arr.type)))
            if arr.null_count
            else arr.flatten()
        )
        out[f.name] = _scalars(values, f.element, f.name).reshape(len(arr), n)
    else:
        out[f.name] = _scalars(arr, t, f.name)
    if f.nullable:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        out[f.name + VALID_SUFFIX] = np.ascontiguousarray(valid, dtype=np.bool_)
    return out


def _own_buffers(arr: pa.Array) -> pa.Array:
    """``arr``, copied into buffers of its own size if it is a slice of a larger array.

    Pickling a slice ships its parent's whole buffers: a 4,096-row slice of a 65,536-row row
    group would cross the pipe sixteen times over.
    """
    if arr.get_total_buffer_size() <= 2 * arr.nbytes + 4096:
        return arr
    return pa.concat_arrays([arr])


class Coded(NamedTuple):
    """A dictionary-encoded string or binary column on the wire: each row's code (-1 for a
    null) and the distinct values. Finished by indexing the values, so each distinct string is
    made once per message rather than once per row."""

    codes: np.ndarray
    values: list


def _coded(arr: pa.DictionaryArray) -> Coded:
    codes = arr.indices
    if codes.null_count:
        codes = pc.fill_null(codes, -1)
    return Coded(codes.to_numpy(), arr.dictionary.to_pylist())


def _decode_codes(value: Coded) -> list:
    lookup = np.empty(len(value.values) + 1, dtype=object)
    lookup[:-1] = value.values
    lookup[-1] = None  # code -1
    return lookup[value.codes].tolist()


class Ragged(NamedTuple):
    """A ``list<T>`` column on the wire: every row's values end to end, and each row's length."""

    values: np.ndarray
    lengths: np.ndarray


def finish_value(value: object) -> Any:
    """One wire value as a batch holds it: a tensor (sharing the numpy buffer) or a list; a
    derive's whole-message summary (:class:`~pipeline.readers.derive.Summary`) as it came."""
    if isinstance(value, np.ndarray):
        return _from_numpy(value)
    if isinstance(value, Coded):
        return _decode_codes(value)
    if isinstance(value, Ragged):
        flat = _from_numpy(value.values)
        return list(torch.split(flat, value.lengths.tolist())) if len(value.lengths) else []
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value.to_pylist()
    return value  # a derive's Summary, handed over as it came


def with_positions(wire: Wire, positions: np.ndarray | pa.Array | pa.ChunkedArray) -> Wire:
    """``wire`` with each row's index position under :data:`POSITION_KEY` (``int64``)."""
    if not isinstance(positions, np.ndarray):
        positions = positions.to_numpy()
    wire[POSITION_KEY] = np.ascontiguousarray(positions, dtype=np.int64)
    return wire


def wire_to_batch(wire: dict[str, object]) -> Batch:
    """Finish a :class:`Wire` batch: numpy to tensors (zero-copy), Arrow strings to lists."""
    return {k: finish_value(v) for k, v in wire.items()}


def _null_fill_list(list_type: pa.FixedSizeListType) -> pa.Scalar:
    value_type = list_type.value_type
    fill: float | int | bool = 0
    if pa.types.is_floating(value_type):
        fill = float("nan")
    elif pa.types.is_boolean(value_type):
        fill = False
    return pa.scalar([fill] * list_type.list_size, list_type)


def _encodes(arrow_type: pa.DataType, f: SchemaField) -> bool:
    """Whether ``arrow_type`` is a dictionary encoding of ``f``'s declared string or binary."""
    return (
        f.type in ("string", "binary")
        and pa.types.is_dictionary(arrow_type)
        and arrow_type.value_type == f.arrow_type
    )


def to_wire(
    data: pa.Table | pa.RecordBatch, schema: Schema, columns: Iterable[str] | None = None
) -> Wire:
    """Convert a table or record batch to a :class:`Wire` batch typed by the declared ``schema``.

    ``columns`` (default: every column of ``data``) must all be declared; a column whose Arrow
    type differs from its declaration is refused rather than silently converted (a declared
    string or binary column may be dictionary-encoded: it still yields ``list[str]``).
    """
    names = list(columns) if columns is not None else list(data.schema.names)
    wire = Wire()
    for name in names:
        f = schema.field(name)
        col = data.column(name)
        if col.type != f.arrow_type and not _encodes(col.type, f):
            raise TypeError(
                f"column {name!r}: declared {f.type} ({f.arrow_type}), found Arrow {col.type}"
            )
        wire.update(column_to_wire(col, f))
    return wire


def to_batch(
    data: pa.Table | pa.RecordBatch, schema: Schema, columns: Iterable[str] | None = None
) -> Batch:
    """Convert a table or record batch to a dict batch typed by the declared ``schema``.

    ``columns`` (default: every column of ``data``) must all be declared; a column whose Arrow
    type differs from its declaration is refused rather than silently converted.
    """
    return wire_to_batch(to_wire(data, schema, columns))
