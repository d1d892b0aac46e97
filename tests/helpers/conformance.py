"""``docs/conformance.md``: what ``lithi-bundle stage`` does with each column type in each format.

Every cell is a real staging: a table of an id and one column ``c`` (edge values and a null) is
written in the format, staged through the CLI (with a schema file for CSV and JSON Lines), and
either read back from the staged bundle and compared value by value with the source, or refused
with exit code 2 and one line, whose reason the document quotes. Anything else (exit 1, a
traceback, a value that changed) fails the generation, so the document cannot describe a
behaviour the code does not have.

``tests/bundle/test_conformance.py`` fails if the checked-in document differs from what this
generates; ``python -m tests.helpers.conformance`` rewrites it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.verify import verify
from tests.helpers.bundles import INT_RANGES
from tests.helpers.corpus import run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
#: (heading, --format value, file suffix)
FORMATS = [
    ("Parquet", "parquet", ".parquet"),
    ("Arrow IPC / Feather", "ipc", ".feather"),
    ("CSV", "csv", ".csv"),
    ("JSON Lines", "jsonl", ".jsonl"),
]


@dataclass(frozen=True)
class Row:
    """One source column type: its label, values (a null among them), and the v1 type a text
    format's schema file declares for it (``None``: the type has no v1 name and is declared as
    itself, which the schema file refuses)."""

    label: str
    values: pa.Array
    declared: str | None


def _scalar_values(name: str) -> list:
    if name in INT_RANGES:
        return list(INT_RANGES[name])
    return {
        "string": ['comma, "quote", new\nline', "", "NA", "null"],  # NA, null: not nulls
        "bool": [True, False],
        "float16": [0.5, -65504.0],
        "float32": [1.25, -3.4028234663852886e38],
        "float64": [0.1, -1e308],
        "binary": [b"\x00\xff", b""],
        "date32": [date(1970, 1, 1), date(9999, 12, 31)],
        "timestamp[us,UTC]": [0, 253402300799999999],  # microseconds: 9999-12-31T23:59:59.999999
    }[name]


def _array(values: list, dtype: pa.DataType) -> pa.Array:
    if pa.types.is_float16(dtype):
        mask = np.array([v is None for v in values])
        data = np.array([0.0 if v is None else v for v in values], dtype=np.float16)
        return pa.array(data, type=dtype, mask=mask)
    if pa.types.is_list(dtype) or pa.types.is_fixed_size_list(dtype):
        flat = [x for v in values if v is not None for x in v]
        inner = _array(flat, dtype.value_type)
        if pa.types.is_fixed_size_list(dtype):
            full = [x for v in values for x in (v if v is not None else [None] * dtype.list_size)]
            mask = pa.array([v is None for v in values])
            return pa.FixedSizeListArray.from_arrays(
                _array(full, dtype.value_type), dtype.list_size, mask=mask
            )
        offsets, pos = [0], 0
        for v in values:
            pos += 0 if v is None else len(v)
            offsets.append(pos)
        mask = pa.array([v is None for v in values])
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner, mask=mask)
    return pa.array(values, type=dtype)


def rows() -> list[Row]:
    """Every row of the matrix: the v1 vocabulary, then source types that are not v1 types."""
    out = []
    for name in fmt.SCALAR_TYPES:
        v = _scalar_values(name)
        out.append(Row(name, _array([*v, None], fmt.to_arrow(name)), name))
    for name in fmt.SCALAR_TYPES:
        v = _scalar_values(name)
        t = f"list<{name}>"
        out.append(Row(t, _array([[v[0], None], [], None], fmt.to_arrow(t)), t))
    for name in fmt.SCALAR_TYPES:
        v = _scalar_values(name)
        t = f"fixed_size_list<{name},2>"
        out.append(Row(t, _array([[v[0], None], [v[1], v[0]], None], fmt.to_arrow(t)), t))
    ts = "timestamp[us,UTC]"
    out += [
        Row(
            "timestamp[ns,UTC], whole microseconds",
            pa.array([0, 1_000, None], pa.timestamp("ns", "UTC")),
            ts,
        ),
        Row(
            "timestamp[ns,UTC], nanoseconds",
            pa.array([0, 1, None], pa.timestamp("ns", "UTC")),
            ts,
        ),
        Row("timestamp[ms,UTC]", pa.array([0, 1, None], pa.timestamp("ms", "UTC")), ts),
        Row(
            "timestamp[us,Europe/Berlin]",
            pa.array([0, 1, None], pa.timestamp("us", "Europe/Berlin")),
            ts,
        ),
        Row("timestamp[us] (no time zone)", pa.array([0, 1, None], pa.timestamp("us")), ts),
        Row("large_string", pa.array(["a", "", None], pa.large_string()), "string"),
        Row("large_binary", pa.array([b"a", b"", None], pa.large_binary()), "binary"),
        Row(
            "large_list<int64>", pa.array([[1], [], None], pa.large_list(pa.int64())), "list<int64>"
        ),
        Row("dictionary<int32,string>", pa.array(["a", "b", None]).dictionary_encode(), "string"),
        Row("decimal128(10,2)", pa.array([1, None], pa.decimal128(10, 2)), None),
        Row("time64[us]", pa.array([0, None], pa.time64("us")), None),
        Row("duration[us]", pa.array([0, None], pa.duration("us")), None),
        Row("struct<a:int64>", pa.array([{"a": 1}, None]), None),
        Row(
            "map<string,int64>",
            pa.array([[("a", 1)], None], pa.map_(pa.string(), pa.int64())),
            None,
        ),
        Row("list<list<int64>>", pa.array([[[1]], None], pa.list_(pa.list_(pa.int64()))), None),
        Row("null", pa.nulls(2), None),
    ]
    return out


# -- writing a row in a format ---------------------------------------------------------------


def _table(row: Row) -> pa.Table:
    ids = pa.array([f"i{k}" for k in range(len(row.values))])
    return pa.table({"id": ids, "c": row.values})


def _text_values(values: pa.Array) -> list:
    """The column as Python values a text format can write: temporal values as Arrow prints
    them, half floats as floats, bytes as Latin-1 text (refused before reading anyway)."""
    t = values.type
    inner = t.value_type if (pa.types.is_list(t) or pa.types.is_fixed_size_list(t)) else t
    if pa.types.is_temporal(inner):
        target = pa.string() if inner is t else pa.list_(pa.string())
        return pc.cast(values, target).to_pylist()
    if pa.types.is_float16(inner):
        target = pa.float32() if inner is t else pa.list_(pa.float32())
        return values.cast(target).to_pylist()
    out = values.to_pylist()
    if pa.types.is_binary(inner) or pa.types.is_large_binary(inner):
        return [v.decode("latin-1") if isinstance(v, bytes) else v for v in out]
    return out


def _csv_field(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):  # quoted only where CSV needs it, as most writers do
        plain = v and not any(c in v for c in ',"\n\r') and v == v.strip()
        return v if plain else '"' + v.replace('"', '""') + '"'
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + json.dumps(v, default=str).replace('"', '""') + '"'


def write(row: Row, kind: str, path: Path) -> None:
    """Write the row's table in format ``kind`` at ``path``."""
    table = _table(row)
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "ipc":
        feather.write_feather(table, path, compression="uncompressed")
    elif kind == "csv":
        pairs = zip(table.column("id").to_pylist(), _text_values(row.values), strict=True)
        lines = ["id,c"] + [f"{_csv_field(i)},{_csv_field(v)}" for i, v in pairs]
        path.write_text("\n".join(lines) + "\n")
    else:
        pairs = zip(table.column("id").to_pylist(), _text_values(row.values), strict=True)
        path.write_text(
            "".join(json.dumps({"id": i, "c": v}, default=str) + "\n" for i, v in pairs)
        )


def schema_file(row: Row, path: Path) -> None:
    """The schema file a text format is staged with: the row's declared type, nullable."""
    declared = row.declared if row.declared is not None else row.label
    fields = [
        {"name": "id", "type": "string", "nullable": False},
        {"name": "c", "type": declared, "nullable": True},
    ]
    path.write_text(json.dumps({"fields": fields}))


# -- one cell ----------------------------------------------------------------------------------


def cell(row: Row, kind: str, suffix: str, workdir: Path) -> tuple[str, str | None]:
    """Stage one cell; return ``("read", declared type)`` or ``("refused", reason)``.

    Raises ``AssertionError`` for anything but a faithful read or a clean refusal.
    """
    source = Path(f"table{suffix}")
    with contextlib.chdir(workdir):
        write(row, kind, source)
        argv = ["stage", str(source), "--id-field", "id", "--kind", "input", "--out", "bundle"]
        if kind in ("csv", "jsonl"):
            schema_file(row, Path("schema.json"))
            argv += ["--schema", "schema.json"]
        result = run_cli(argv)
        where = f"{row.label} from {kind}"
        assert result.crash is None, f"{where}: {result.crash}"
        if result.code == 2:
            assert result.err.count("\n") == 1 and not Path("bundle").exists(), where
            reason = result.err.strip().removeprefix("lithi-bundle stage: ")
            return "refused", reason.replace(f"{source}: ", "")
        assert result.code == 0, f"{where}: exit {result.code}: {result.err}"
        snap = verify("bundle")
        declared = snap.manifest.schema_.field("c").type
        got = pa.concat_tables(pq.read_table(p) for p in snap.part_paths()).column("c")
        source_values = row.values
        if pa.types.is_dictionary(source_values.type):
            source_values = source_values.dictionary_decode()
        expected = source_values.cast(fmt.to_arrow(declared))
        assert got.combine_chunks().equals(expected), f"{where}: {got} != {expected}"
        return "read", declared


def matrix(workdir: Path) -> list[tuple[Row, list[tuple[str, str | None]]]]:
    """Stage every cell under ``workdir``; the rows with their cells in :data:`FORMATS` order."""
    out = []
    for r, row in enumerate(rows()):
        cells = []
        for f, (_, kind, suffix) in enumerate(FORMATS):
            d = workdir / f"r{r:02d}-f{f}"
            d.mkdir()
            cells.append(cell(row, kind, suffix, d))
        out.append((row, cells))
    return out


# -- the document ------------------------------------------------------------------------------

PRELUDE = """\
# Input conformance: what `lithi-bundle stage` reads

<!-- Generated by `python -m tests.helpers.conformance` from real stagings; do not edit. A test
(tests/bundle/test_conformance.py) fails when this file differs from what the code does. -->

`lithi-bundle stage TABLE` reads Parquet (`.parquet`, `.pq`), Arrow IPC files and streams
(`.arrow`, `.arrows`, `.ipc`, `.feather`: Feather v2 is an Arrow IPC file), CSV (`.csv`) and
JSON Lines (`.jsonl`, `.ndjson`), with pyarrow's own readers; `--format` overrides the suffix.
Parquet and Arrow IPC carry their types. CSV and JSON Lines carry none, so they are read only
with `--schema FILE.json`, the manifest's `schema` object
(`{"fields": [{"name": "id", "type": "string", "nullable": false}, ...]}`); nothing is inferred.
In CSV an empty unquoted field is null and `""` is the empty string (no other text means null:
`NA`, `nan`, `null` are values); timestamps need a zone offset (`Z` or `+01:00`). In JSON Lines
a missing key is null and an undeclared key is refused.

Each row below is a source column type. For Parquet and Arrow IPC the file holds a column of
that type; for CSV and JSON Lines the text holds its values as Arrow prints them, and the
schema file declares the v1 type named in the row (or, for a type with no v1 name, the type
itself, which the schema file refuses). Every cell was staged from a column holding edge values
(minimum and maximum, an empty string, `NA`, a quote, a comma and a newline, a far date) and a
null: **read** means the staged bundle holds exactly the source values (as the v1 type shown,
where the source type is not one), **refused** means exit 2 with the one-line reason below.
"""


def render(result: list[tuple[Row, list[tuple[str, str | None]]]]) -> str:
    """The Markdown document for a :func:`matrix` result."""
    reasons: list[str] = []
    lines = [
        PRELUDE,
        "| source column | " + " | ".join(h for h, _, _ in FORMATS) + " |",
        "|---|" + "---|" * len(FORMATS),
    ]
    for row, cells in result:
        shown = []
        for outcome, detail in cells:
            if outcome == "read":
                shown.append("read" if detail == row.label else f"read as `{detail}`")
            else:
                assert detail is not None
                if detail not in reasons:
                    reasons.append(detail)
                shown.append(f"refused ({reasons.index(detail) + 1})")
        lines.append(f"| `{row.label}` | " + " | ".join(shown) + " |")
    lines += ["", "Reasons, as `lithi-bundle stage` prints them:", ""]
    for i, reason in enumerate(reasons, 1):
        text = reason.replace("|", "\\|")
        lines.append(f"{i}. {text}")
    return "\n".join(lines) + "\n"


def generate() -> str:
    """Stage every cell in a temporary directory and render the document."""
    with tempfile.TemporaryDirectory() as tmp:
        return render(matrix(Path(tmp)))


def main(argv: list[str] | None = None) -> int:
    """Rewrite ``docs/conformance.md`` (or, with ``--check``, exit 1 if it is out of date)."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if the document is out of date")
    args = ap.parse_args(argv)
    text = generate()
    current = DOC.read_text() if DOC.exists() else ""
    if args.check:
        if current != text:
            print(f"{DOC} is out of date: run python -m tests.helpers.conformance", file=sys.stderr)
            return 1
        return 0
    if current != text:
        DOC.write_text(text)
    print(f"{DOC}: {'written' if current != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
