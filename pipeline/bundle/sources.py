"""Tables to stage, read batch by batch from Parquet, Arrow IPC (Feather v2), CSV or JSON Lines.

Parquet and Arrow IPC carry their own types; CSV and JSON Lines do not, so they are read only with
declared types (a schema file holding the manifest's ``schema`` object) and nothing is inferred.
Every reader is pyarrow's own; the only work here is choosing what pyarrow reads a declared type
as, and refusing, with the reason, what a format cannot hold. A read error is a
:class:`SourceError` naming the file (and the column, where pyarrow says which).
``docs/conformance.md`` lists what each format gives for each type, generated from a test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq
from pydantic import ValidationError

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import one_line
from pipeline.bundle.manifest import Schema

FORMATS = ("parquet", "ipc", "csv", "jsonl")
SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "ipc",
    ".arrows": "ipc",
    ".feather": "ipc",
    ".ipc": "ipc",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}
#: Formats that carry no types: they are read only with a declared schema.
TEXT_FORMATS = ("csv", "jsonl")
#: Rows per batch read from Parquet (one staged row group).
BATCH_ROWS = 65_536
#: JSON Lines block size: the longest line pyarrow can read must fit in one block.
JSON_BLOCK_BYTES = 16 * 1024 * 1024
#: The largest schema file read: room for the most columns a manifest may declare.
MAX_SCHEMA_FILE_BYTES = 16 * 1024 * 1024


class SourceError(ValueError):
    """The table cannot be read as asked: not that format, a type the format cannot hold, a
    value that is not of its declared type. The message names the file and, where known, the
    column."""


@dataclass(frozen=True)
class Source:
    """A table to stage: its format, the schema to declare, and its rows as record batches."""

    path: Path
    format: str
    schema: pa.Schema
    num_rows: int | None  # known before reading (Parquet, an IPC file), else None
    _batches: Callable[[], Iterator[pa.RecordBatch]]

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows, one record batch at a time; a read error is a :class:`SourceError`."""
        try:
            yield from self._batches()
        except SourceError:
            raise
        except (pa.ArrowException, OSError, ValueError) as e:
            raise SourceError(
                f"{self.path}: cannot read as {self.format}: {_one_line(e)}"
            ) from None


def format_of(path: str | Path, given: str | None = None) -> str:
    """The format to read ``path`` as: ``given``, else the one its suffix names."""
    if given is not None:
        if given not in FORMATS:
            raise SourceError(f"format {given!r} is not one of {', '.join(FORMATS)}")
        return given
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise SourceError(
            f"{path}: cannot tell the format from the suffix {suffix!r}; name it with --format "
            f"({', '.join(FORMATS)}) or use one of {', '.join(SUFFIXES)}"
        )
    return SUFFIXES[suffix]


def read_schema_file(path: str | Path) -> Schema:
    """Read declared column types from a JSON file holding ``{"fields": [...]}``.

    The object is the manifest's ``schema`` (see ``docs/bundle-format.md``), validated as
    strictly as a manifest: a type outside the v1 vocabulary or a ``"nullable": "yes"`` is
    refused naming the field.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCHEMA_FILE_BYTES + 1)
    except OSError as e:
        raise SourceError(f"{path}: cannot read the schema file: {e.strerror}") from None
    if len(data) > MAX_SCHEMA_FILE_BYTES:
        raise SourceError(f"{path}: schema file larger than {MAX_SCHEMA_FILE_BYTES} bytes")
    try:
        return Schema.model_validate_json(data, strict=True)
    except ValidationError as e:
        raise SourceError(
            f'{path}: not a schema file ({{"fields": [{{"name", "type", "nullable"}}, ...]}}): '
            f"{one_line(e)}"
        ) from None


def open_source(
    path: str | Path, *, format: str | None = None, declared: Schema | None = None
) -> Source:
    """Open ``path`` for staging: Parquet, Arrow IPC/Feather, CSV or JSON Lines.

    Parquet and IPC tables keep their own types unless ``declared`` is given (then each column is
    cast to its declared type, which must be a safe cast). CSV and JSON Lines need ``declared``.
    """
    path = Path(path)
    kind = format_of(path, format)
    if kind in TEXT_FORMATS and declared is None:
        raise SourceError(
            f"{path}: {kind} carries no types; give the declared types with --schema FILE.json "
            '(a JSON object {"fields": [{"name", "type", "nullable"}, ...]})'
        )
    opener = {"parquet": _parquet, "ipc": _ipc, "csv": _csv, "jsonl": _jsonl}[kind]
    try:
        return opener(path, declared)
    except SourceError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        raise SourceError(f"{path}: cannot read as {kind}: {_one_line(e)}") from None


# -- self-describing formats -----------------------------------------------------------------


def _parquet(path: Path, declared: Schema | None) -> Source:
    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow

    def batches() -> Iterator[pa.RecordBatch]:
        yield from pf.iter_batches(batch_size=BATCH_ROWS)

    return _typed(path, "parquet", schema, pf.metadata.num_rows, batches, declared)


def _ipc(path: Path, declared: Schema | None) -> Source:
    """An Arrow IPC file (Feather v2 is one), else an IPC stream."""
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
    except pa.ArrowInvalid:
        with pa.OSFile(str(path)) as f:  # a stream: its schema comes first
            schema = pa.ipc.open_stream(f).schema

        def stream() -> Iterator[pa.RecordBatch]:
            with pa.OSFile(str(path)) as f:
                yield from pa.ipc.open_stream(f)

        return _typed(path, "ipc", schema, None, stream, declared)
    rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)

    return _typed(path, "ipc", reader.schema, rows, batches, declared)


def _typed(
    path: Path,
    kind: str,
    schema: pa.Schema,
    rows: int | None,
    batches: Callable[[], Iterator[pa.RecordBatch]],
    declared: Schema | None,
) -> Source:
    if declared is None:
        return Source(path, kind, schema, rows, batches)
    target = declared.to_arrow()
    _same_columns(path, target.names, schema.names, "columns")
    return Source(path, kind, target, rows, lambda: _cast_all(path, batches(), target))


# -- text formats: declared types only -------------------------------------------------------

_TEXT_REASON = "is text: it holds no raw bytes; stage binary columns from Parquet or Arrow IPC"


def _csv_type(name: str, dtype: pa.DataType) -> pa.DataType:
    """What pyarrow's CSV reader reads a declared type as (it is cast to the declared one)."""
    if pa.types.is_list(dtype) or pa.types.is_fixed_size_list(dtype):
        raise SourceError(
            f"column {name!r}: CSV has no list values; stage list columns from JSON Lines, "
            "Parquet or Arrow IPC"
        )
    if pa.types.is_binary(dtype):
        raise SourceError(f"column {name!r}: CSV {_TEXT_REASON}")
    if pa.types.is_float16(dtype):
        return pa.float32()  # pyarrow parses no half floats; every float16 is a float32
    return dtype


def _json_type(name: str, dtype: pa.DataType) -> pa.DataType:
    """What pyarrow's JSON reader reads a declared type as (it is cast to the declared one)."""
    if pa.types.is_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return pa.list_(_json_type(name, dtype.value_type))
    if pa.types.is_binary(dtype):
        raise SourceError(f"column {name!r}: JSON Lines {_TEXT_REASON}")
    if pa.types.is_float16(dtype):
        return pa.float32()
    if pa.types.is_date(dtype) or pa.types.is_timestamp(dtype):
        # Read as text and cast, as CSV does: a timestamp without a zone offset is refused
        # (pyarrow's JSON reader would take it as UTC without saying so).
        return pa.string()
    return dtype


def _csv(path: Path, declared: Schema | None) -> Source:
    assert declared is not None
    target = declared.to_arrow()
    read_types = {f.name: _csv_type(f.name, f.type) for f in target}
    convert = pcsv.ConvertOptions(
        column_types=read_types,
        null_values=[""],  # an empty unquoted field is null; "NA", "nan", "null" are values
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,  # "" is the empty string
    )
    parse = pcsv.ParseOptions(newlines_in_values=True)
    header = pcsv.open_csv(path, parse_options=parse, convert_options=convert).schema.names
    _same_columns(path, target.names, header, "header")

    def batches() -> Iterator[pa.RecordBatch]:
        reader = pcsv.open_csv(path, parse_options=parse, convert_options=convert)
        yield from _cast_all(path, reader, target)

    return Source(path, "csv", target, None, batches)


def _jsonl(path: Path, declared: Schema | None) -> Source:
    assert declared is not None
    target = declared.to_arrow()
    read_schema = pa.schema(
        [pa.field(f.name, _json_type(f.name, f.type), nullable=True) for f in target]
    )
    options = pjson.ParseOptions(explicit_schema=read_schema, unexpected_field_behavior="error")
    read = pjson.ReadOptions(block_size=JSON_BLOCK_BYTES)

    def batches() -> Iterator[pa.RecordBatch]:
        reader = pjson.open_json(path, read_options=read, parse_options=options)
        yield from _cast_all(path, reader, target)

    if path.stat().st_size:  # open once now so "not JSON Lines" is found before staging starts
        pjson.open_json(path, read_options=read, parse_options=options)
    return Source(path, "jsonl", target, None, batches)


# -- shared ------------------------------------------------------------------------------------


def _same_columns(path: Path, expected: list[str], found: list[str], what: str) -> None:
    if found != expected:
        missing = [n for n in expected if n not in found]
        extra = [n for n in found if n not in expected]
        detail = "; ".join(
            x
            for x in (
                f"missing {missing}" if missing else "",
                f"not declared {extra}" if extra else "",
                "same names in another order" if not missing and not extra else "",
            )
            if x
        )
        raise SourceError(
            f"{path}: {what} expected {expected} (the declared schema), found {found}: {detail}"
        )


def _cast_all(
    path: Path, batches: Iterator[pa.RecordBatch], target: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Each batch as declared (:func:`~pipeline.bundle.format.conform`); a value that does not
    fit its declared type is a :class:`SourceError` naming the file and the column."""
    for batch in batches:
        try:
            yield fmt.conform(batch, target)
        except fmt.CastRefused as e:
            raise SourceError(
                f"{path}: column {e.column!r}: cannot read {e.found} values as the "
                f"declared {e.declared}: {e.reason}"
            ) from None


def _one_line(e: BaseException) -> str:
    """An exception's message on one line (pyarrow's sometimes span several)."""
    return " ".join(str(e).split()) or type(e).__name__
