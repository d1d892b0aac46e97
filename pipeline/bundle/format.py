"""Bundle format v1: names, the type vocabulary, and its mapping to Arrow types.

This module is the single definition of what a bundle looks like on disk. Every other module
imports its constants rather than spelling a file name or a type string again.
"""

from __future__ import annotations

import re
from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc

MANIFEST_NAME = "result-manifest.json"
PARTS_DIR = "parts"
OUTSTANDING_NAME = "outstanding.parquet"
MANIFEST_VERSION = 1

#: Namespaced result columns every result bundle carries.
LITHI_PREFIX = "lithi_"
STATUS_COLUMN = "lithi_status"
CONFIDENCE_COLUMN = "lithi_confidence"
VERIFICATION_COLUMN = "lithi_verification"
RESULT_COLUMNS = (STATUS_COLUMN, CONFIDENCE_COLUMN, VERIFICATION_COLUMN)
#: The label a labelling job adds beside the result columns (optional; not every job has one).
LABEL_COLUMN = "lithi_label"
STATUSES = ("accepted", "failed", "abstained")
#: Declared types each result column may have (confidence is any float width).
RESULT_COLUMN_TYPES: dict[str, tuple[str, ...]] = {
    STATUS_COLUMN: ("string",),
    CONFIDENCE_COLUMN: ("float16", "float32", "float64"),
    VERIFICATION_COLUMN: ("string",),
}


def count_statuses(
    col: pa.Array | pa.ChunkedArray,
) -> tuple[dict[str, int], dict[str | None, int]]:
    """Rows per ``lithi_status`` value: the three statuses (zero where absent), and apart from
    them every other value found (``None`` for nulls), which a valid bundle never holds."""
    counts = dict.fromkeys(STATUSES, 0)
    unknown: dict[str | None, int] = {}
    for row in pc.value_counts(col).to_pylist():
        value, n = row["values"], row["counts"]
        if value in counts:
            counts[value] += n
        else:
            unknown[value] = n
    return counts, unknown


def part_path(number: int) -> str:
    """Return the bundle-relative path of part ``number`` (``parts/part-NNNNN.parquet``)."""
    if not 0 <= number <= 99999:
        raise ValueError(f"part number {number} is outside 0..99999")
    return f"{PARTS_DIR}/part-{number:05d}.parquet"


_SCALARS: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "binary": pa.binary(),
    "date32": pa.date32(),
    "timestamp[us,UTC]": pa.timestamp("us", tz="UTC"),
}
SCALAR_TYPES = tuple(_SCALARS)

# The element may itself contain a comma (``timestamp[us,UTC]``); it is checked to be a scalar.
_LIST_RE = re.compile(r"^list<(?P<t>.+)>$")
_FIXED_RE = re.compile(r"^fixed_size_list<(?P<t>.+),(?P<n>[1-9]\d*)>$")


class UnknownType(ValueError):
    """A type string outside the v1 vocabulary, or an Arrow type with no vocabulary name."""


@lru_cache(maxsize=256)
def to_arrow(type_name: str) -> pa.DataType:
    """Map a vocabulary type string (e.g. ``fixed_size_list<float32,64>``) to its Arrow type."""
    if type_name in _SCALARS:
        return _SCALARS[type_name]
    if m := _LIST_RE.match(type_name):
        return pa.list_(_scalar(m["t"], type_name))
    if m := _FIXED_RE.match(type_name):
        return pa.list_(_scalar(m["t"], type_name), int(m["n"]))
    raise UnknownType(
        f"type {type_name!r} is not in the v1 vocabulary "
        f"({', '.join(SCALAR_TYPES)}, list<T>, fixed_size_list<T,N>)"
    )


def _scalar(name: str, whole: str) -> pa.DataType:
    if name not in _SCALARS:
        raise UnknownType(f"element type {name!r} of {whole!r} is not a v1 scalar type")
    return _SCALARS[name]


def from_arrow(dtype: pa.DataType) -> str:
    """Name an Arrow type in the vocabulary; dictionary-encoded values count as their value type."""
    if pa.types.is_dictionary(dtype):
        return from_arrow(dtype.value_type)
    for name, t in _SCALARS.items():
        if dtype == t:
            return name
    if pa.types.is_fixed_size_list(dtype):
        return f"fixed_size_list<{from_arrow_scalar(dtype.value_type)},{dtype.list_size}>"
    if pa.types.is_list(dtype):
        return f"list<{from_arrow_scalar(dtype.value_type)}>"
    raise UnknownType(f"Arrow type {dtype} has no name in the v1 vocabulary")


def from_arrow_scalar(dtype: pa.DataType) -> str:
    """Name a scalar Arrow type; lists of lists are outside the vocabulary."""
    name = from_arrow(dtype)
    if name not in _SCALARS:
        raise UnknownType(f"nested list type {dtype} is outside the v1 vocabulary")
    return name
