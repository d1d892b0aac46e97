"""Bundle format v1: names, the type vocabulary, and its mapping to Arrow types.

This module is the single definition of what a bundle looks like on disk. Every other module
imports its constants rather than spelling a file name or a type string again.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final, Literal, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.bundle.errors import IdentifierError, SchemaMismatch

MANIFEST_NAME = "result-manifest.json"
PARTS_DIR = "parts"
OUTSTANDING_NAME = "outstanding.parquet"
MANIFEST_VERSION: Final = 1
#: The largest manifest read: well above what the most parts and columns a manifest may list take
#: (``docs/bundle-format.md``), so anything bigger is hostile, and refused before it is parsed.
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
FLOAT_TYPES = ("float16", "float32", "float64")
#: Declared types each result column may have (confidence is any float width).
RESULT_COLUMN_TYPES: dict[str, tuple[str, ...]] = {
    STATUS_COLUMN: ("string",),
    CONFIDENCE_COLUMN: FLOAT_TYPES,
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
#: Scalars stored as numbers (booleans, dates and instants included): what a model can take.
NUMERIC_TYPES = tuple(t for t in SCALAR_TYPES if t not in ("string", "binary"))

# The element may itself contain a comma (``timestamp[us,UTC]``); it is checked to be a scalar.
_LIST_RE = re.compile(r"^list<(?P<t>.+)>$")
# At most 10 digits: a longer size is refused before ``int()`` ever sees it.
_FIXED_RE = re.compile(r"^fixed_size_list<(?P<t>.+),(?P<n>[1-9]\d{0,9})>$")


class UnknownType(ValueError):
    """A type string outside the v1 vocabulary, or an Arrow type with no vocabulary name."""


class ParsedType(NamedTuple):
    """A vocabulary type string taken apart: a scalar, ``list<T>`` or ``fixed_size_list<T,N>``."""

    #: The scalar: the type itself, or the element type of a list.
    element: str
    shape: Literal["scalar", "list", "fixed_size_list"]
    #: ``N`` of a fixed-size list; ``None`` otherwise.
    list_size: int | None = None

    @property
    def width(self) -> int | None:
        """Values per row: 1 for a scalar, ``N`` for a fixed-size list, ``None`` for ``list<T>``."""
        if self.shape == "list":
            return None
        return self.list_size if self.shape == "fixed_size_list" else 1

    @property
    def is_list(self) -> bool:
        """Whether this is a variable-length ``list<T>``."""
        return self.shape == "list"

    @property
    def is_fixed_size_list(self) -> bool:
        """Whether this is a ``fixed_size_list<T,N>``."""
        return self.shape == "fixed_size_list"


@lru_cache(maxsize=256)
def parse_type(type_name: str) -> ParsedType:
    """Take a vocabulary type string apart; :class:`UnknownType` says why one is not v1."""
    if type_name in _SCALARS:
        return ParsedType(type_name, "scalar")
    if m := _LIST_RE.match(type_name):
        return ParsedType(_scalar(m["t"], type_name), "list")
    if m := _FIXED_RE.match(type_name):
        size = int(m["n"])
        if size > MAX_LIST_SIZE:
            raise UnknownType(
                f"type {type_name!r}: list size {size} exceeds the largest Arrow list size "
                f"{MAX_LIST_SIZE}"
            )
        return ParsedType(_scalar(m["t"], type_name), "fixed_size_list", size)
    raise UnknownType(
        f"type {type_name!r} is not in the v1 vocabulary "
        f"({', '.join(SCALAR_TYPES)}, list<T>, fixed_size_list<T,N>)"
    )


@lru_cache(maxsize=256)
def to_arrow(type_name: str) -> pa.DataType:
    """Map a vocabulary type string (e.g. ``fixed_size_list<float32,64>``) to its Arrow type."""
    parsed = parse_type(type_name)
    element = _SCALARS[parsed.element]
    if parsed.shape == "list":
        return pa.list_(element)
    if parsed.shape == "fixed_size_list":
        return pa.list_(element, parsed.list_size)
    return element


def _scalar(name: str, whole: str) -> str:
    if name not in _SCALARS:
        raise UnknownType(f"element type {name!r} of {whole!r} is not a v1 scalar type")
    return name


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


def vocabulary_type(column: str, dtype: pa.DataType) -> pa.DataType:
    """The Arrow type of the v1 type a source column is declared as, or :class:`UnknownType`
    naming the column and why.

    Dictionary, large and view types become their plain type and a timestamp with a zone
    becomes ``timestamp[us,UTC]`` (whether the values fit is :func:`conform`'s to check).
    """
    if pa.types.is_dictionary(dtype):
        return vocabulary_type(column, dtype.value_type)
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return pa.binary()
    if pa.types.is_timestamp(dtype):
        if dtype.tz is None:
            raise UnknownType(
                f"column {column!r}: {dtype} has no time zone; v1 stores instants as "
                "timestamp[us,UTC], so say which zone the values are in before staging"
            )
        return pa.timestamp("us", tz="UTC")  # an instant: only the unit may change (checked)
    if (
        pa.types.is_list(dtype)
        or pa.types.is_large_list(dtype)
        or pa.types.is_list_view(dtype)
        or pa.types.is_large_list_view(dtype)
    ):
        return pa.list_(vocabulary_type(column, dtype.value_type))
    if pa.types.is_fixed_size_list(dtype):
        return pa.list_(vocabulary_type(column, dtype.value_type), dtype.list_size)
    try:
        from_arrow(dtype)
    except UnknownType:
        raise UnknownType(
            f"column {column!r}: type {dtype} is not in the v1 vocabulary "
            f"({', '.join(SCALAR_TYPES)}, list<T>, fixed_size_list<T,N>)"
        ) from None
    return dtype


def vocabulary_schema(schema: pa.Schema, id_field: str) -> pa.Schema:
    """The Arrow schema a source table is declared as: each column as its v1 type (see
    :func:`vocabulary_type`), the id column a non-null string."""
    if id_field not in schema.names:
        raise SchemaMismatch(f"id field {id_field!r} is not a column (columns: {schema.names})")
    fields = []
    for f in schema:
        t = vocabulary_type(f.name, f.type)
        if (pa.types.is_list(t) or pa.types.is_fixed_size_list(t)) and not _is_scalar(t.value_type):
            raise UnknownType(
                f"column {f.name!r}: {f.type} is a list of lists; v1 lists hold scalars only"
            )
        fields.append(pa.field(f.name, t, nullable=f.nullable and f.name != id_field))
    if not pa.types.is_string(fields[schema.get_field_index(id_field)].type):
        raise IdentifierError(
            f"id field {id_field!r} must be a string column, found "
            f"{schema.field(id_field).type}; ids are never numbers"
        )
    return pa.schema(fields)


def _is_scalar(dtype: pa.DataType) -> bool:
    try:
        return from_arrow(dtype) in SCALAR_TYPES
    except UnknownType:
        return False


class CastRefused(ValueError):
    """A column's values cannot be stored as its declared type without changing them."""

    def __init__(self, column: str, found: pa.DataType, declared: str, reason: str) -> None:
        super().__init__(f"column {column!r}: cannot store {found} values as {declared}: {reason}")
        self.column = column
        self.found = found
        self.declared = declared
        self.reason = reason


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` as ``target``: its columns in ``target``'s order, each cast to its declared type.

    The one cast rule for every table that becomes a bundle. Dictionary-encoded values are
    decoded; every cast is a safe one, so a value that does not fit (an overflow, lost precision,
    text that is not a number) is refused with :class:`CastRefused`, never changed. Nullability
    is not checked here: which error a null deserves depends on the column (see ``stage``).
    """
    cols = []
    for f in target:
        i = batch.schema.get_field_index(f.name)
        if i < 0:
            raise ValueError(f"column {f.name!r} is declared but not in the batch")
        col = batch.column(i)
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if col.type != f.type:
            try:
                col = col.cast(f.type)  # safe: a value that does not fit is refused, not changed
            except (pa.ArrowException, ValueError) as e:
                reason = " ".join(str(e).split()) or type(e).__name__
                raise CastRefused(f.name, col.type, from_arrow(f.type), reason) from None
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=target)
