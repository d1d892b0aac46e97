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
#: The largest manifest read: 100,000 part entries take about 20 MB, so anything bigger is hostile.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
#: Every count and size is a Parquet/Arrow int64.
MAX_COUNT = 2**63 - 1
#: ``fixed_size_list<T,N>``: Arrow stores ``N`` as an int32.
MAX_LIST_SIZE = 2**31 - 1

#: The readers add ``<name>__valid`` (a null mask) beside every nullable column ``<name>``, so a
#: declared column of that name would collide with it.
VALID_SUFFIX = "__valid"

#: A version id is one safe path segment: the bundle cache keeps ``bundles/<version_id>/``, the
#: local Compute ``results/<job>/<version_id>/``, and staging names ``.<name>.staging-<random>``;
#: 200 characters leave room for those prefixes and suffixes within a 255-byte file name.
VERSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
_VERSION_ID_RE = re.compile(VERSION_ID_PATTERN)


def check_version_id(value: object, *, what: str = "version_id") -> str:
    """Return ``value`` if it is a valid version id, else raise ``ValueError`` saying why.

    The one rule for version ids, shared by the manifest model, ``stage`` and the bundle cache,
    so an id that could name a path outside its directory is refused wherever it enters.
    """
    if not isinstance(value, str) or not _VERSION_ID_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r:.80} is not a valid version id: expected 1-200 characters from "
            "[A-Za-z0-9._-], starting with a letter or digit (it names a directory)"
        )
    return value


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
# At most 10 digits: a longer size is refused before ``int()`` ever sees it.
_FIXED_RE = re.compile(r"^fixed_size_list<(?P<t>.+),(?P<n>[1-9]\d{0,9})>$")


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
        size = int(m["n"])
        if size > MAX_LIST_SIZE:
            raise UnknownType(
                f"type {type_name!r}: list size {size} exceeds the largest Arrow list size "
                f"{MAX_LIST_SIZE}"
            )
        return pa.list_(_scalar(m["t"], type_name), size)
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
