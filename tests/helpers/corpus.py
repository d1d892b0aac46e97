# ruff: noqa: E501 -- the two case tables below keep one case per line, however long
"""The attack corpus, kept as tests: malformed bundles and bad staging inputs, generated.

:func:`malformed_bundles` lists every way of breaking a bundle the audit of issue 13 tried (and
more), each a small function that corrupts a copy of a pristine bundle in place.
:func:`bad_staging_inputs` lists bad ``lithi-bundle stage`` invocations, each with the exit code
it must end with. ``tests/bundle/test_corpus.py`` runs both; ``python -m tests.helpers.corpus``
prints the counts by class and what the CLI did with each case (exit codes, tracebacks), the
numbers quoted when the corpus changes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from tests.helpers.bundles import (
    footer_says,
    input_table,
    load_manifest,
    make_input,
    make_result,
    nest,
    rebind,
    result_table,
    rewrite_part,
    save_manifest,
    writable,
    write_bytes,
)

P0, P1, P2 = fmt.part_path(0), fmt.part_path(1), fmt.part_path(2)
OUT = fmt.OUTSTANDING_NAME
MANIFEST = fmt.MANIFEST_NAME


# -- malformed bundles ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Malformed:
    """One malformed bundle: how to corrupt a pristine copy, and the first violation expected."""

    name: str
    group: str  # json | model | tree | bytes | parquet | ids
    corrupt: Callable[[Path], None]
    expect: str  # class name of the first violation check() must report
    base: str = "result"  # which pristine bundle is copied: "result" (PARTIAL) or "input"


def pristine(root: Path) -> dict[str, Path]:
    """The pristine bundles every case starts from: a PARTIAL result and an input, 3 parts each."""
    make_result(root / "result", n=30, rows_per_part=10, outstanding=["late-1", "late-2"])
    make_input(root / "input", n=30, rows_per_part=10)
    return {"result": root / "result", "input": root / "input"}


def build(case: Malformed, bases: dict[str, Path], dest: Path) -> Path:
    """Copy the case's pristine bundle to ``dest`` and corrupt it; return ``dest``."""
    shutil.copytree(bases[case.base], dest, symlinks=True)
    case.corrupt(dest)
    return dest


def _text(data: bytes | Callable[[dict], bytes]) -> Callable[[Path], None]:
    """Replace the manifest with ``data`` (or with what ``data(manifest dict)`` returns)."""

    def corrupt(b: Path) -> None:
        raw = data(load_manifest(b)) if callable(data) else data
        write_bytes(b / MANIFEST, raw)

    return corrupt


def _edit(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    """Edit the manifest as JSON data (the files stay as they are)."""

    def corrupt(b: Path) -> None:
        m = load_manifest(b)
        fn(m)
        save_manifest(b, m)

    return corrupt


def _set(dotted: str, value: object) -> Callable[[Path], None]:
    def fn(m: dict) -> None:
        *parents, leaf = dotted.split(".")
        node = m
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(leaf)] = value
        else:
            node[leaf] = value

    return _edit(fn)


def _drop(dotted: str) -> Callable[[Path], None]:
    def fn(m: dict) -> None:
        *parents, leaf = dotted.split(".")
        node = m
        for p in parents:
            node = node[p]
        del node[leaf]

    return _edit(fn)


def _field(i: int, **changes: object) -> Callable[[Path], None]:
    return _edit(lambda m: m["schema"]["fields"][i].update(changes))


def _json(m: dict) -> str:
    return json.dumps(m, indent=2)


def _replace_in_text(old: str, new: str) -> Callable[[Path], None]:
    def make(m: dict) -> bytes:
        text = _json(m)
        assert old in text, old
        return text.replace(old, new, 1).encode()

    return _text(make)


def _nested_json(depth: int) -> Callable[[dict], bytes]:
    def make(m: dict) -> bytes:
        text = json.dumps(m)
        return (text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}").encode()

    return make


def _sparse_manifest(b: Path) -> None:
    with open(writable(b / MANIFEST), "r+b") as f:
        f.truncate(fmt.MAX_MANIFEST_BYTES + 1)


def _file(rel: str, data: bytes = b"") -> Callable[[Path], None]:
    def corrupt(b: Path) -> None:
        path = os.fsencode(b) + b"/" + (rel.encode() if isinstance(rel, str) else rel)
        with open(path, "wb") as f:
            f.write(data)

    return corrupt


def _raw_name(name: bytes) -> Callable[[Path], None]:
    def corrupt(b: Path) -> None:
        with open(os.fsencode(b) + b"/" + name, "wb"):
            pass

    return corrupt


def _replace_path(rel: str, how: str) -> Callable[[Path], None]:
    """Replace bound file ``rel`` by a directory, a FIFO, a symlink to a copy, or nothing."""

    def corrupt(b: Path) -> None:
        p = b / rel
        if how == "symlink":
            copy = b.parent / f"{b.name}-outside-{p.name}"
            shutil.copyfile(p, copy)
            p.unlink()
            os.symlink(copy, p)
            return
        p.unlink()
        if how == "dir":
            p.mkdir()
        elif how == "fifo":
            os.mkfifo(p)

    return corrupt


def _symlinked_parts(b: Path) -> None:
    outside = b.parent / f"{b.name}-outside-parts"
    shutil.move(b / fmt.PARTS_DIR, outside)
    os.symlink(outside, b / fmt.PARTS_DIR)


def _parts_is_a_file(b: Path) -> None:
    shutil.rmtree(b / fmt.PARTS_DIR)
    (b / fmt.PARTS_DIR).write_bytes(b"not a directory")


def _manifest_is(how: str) -> Callable[[Path], None]:
    def corrupt(b: Path) -> None:
        m = b / MANIFEST
        if how == "symlink":
            outside = b.parent / f"{b.name}-outside-manifest.json"
            shutil.copyfile(m, outside)
            m.unlink()
            os.symlink(outside, m)
            return
        m.unlink()
        if how == "dir":
            m.mkdir()
        elif how == "fifo":
            os.mkfifo(m)

    return corrupt


def _not_a_directory(b: Path) -> None:
    shutil.rmtree(b)
    b.write_bytes(b"a file where a bundle should be")


def _many_files(n: int) -> Callable[[Path], None]:
    def corrupt(b: Path) -> None:
        for i in range(n):
            (b / f"stray-{i:05d}").write_bytes(b"")

    return corrupt


def _bytes(rel: str, fn: Callable[[bytes], bytes], *, rebound: bool = False) -> Callable:
    """Rewrite a bound file's bytes; ``rebound`` rebinds the digests so later checks fire."""

    def corrupt(b: Path) -> None:
        p = b / rel
        write_bytes(p, fn(p.read_bytes()))
        if rebound:
            rebind(b)

    return corrupt


def _flip(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(out) // 2] ^= 0xFF
    return bytes(out)


def _wreck_pages(data: bytes) -> bytes:
    out = bytearray(data)
    out[8:200] = b"\xff" * 192  # the first data pages; the footer stays readable
    return bytes(out)


def _table(rel: str, change: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    """Rewrite a bound Parquet file with ``change(table)``, then rebind its digests."""

    def corrupt(b: Path) -> None:
        t = change(pq.read_table(b / rel))
        rewrite_part(b, rel, t)

    return corrupt


def _column(t: pa.Table, name: str, values: list, dtype: pa.DataType | None = None) -> pa.Table:
    i = t.schema.get_field_index(name)
    f = t.schema.field(i)
    nullable = f.nullable or any(v is None for v in values)
    return t.set_column(
        i, pa.field(name, dtype or f.type, nullable=nullable), pa.array(values, dtype or f.type)
    )


def _ids(t: pa.Table, change: Callable[[list], None]) -> pa.Table:
    ids = t.column("id").to_pylist()
    change(ids)
    return _column(t, "id", ids)


def _footer_lies(b: Path) -> None:
    """An input bundle whose first part's footer says 9 rows while its row group holds 10 (and
    pyarrow reads 10); the manifest agrees with the footer, so only the footer check sees it."""
    footer_says(b / P0, 9)
    m = rebind(b)
    m["parts"][0]["rows"] = 9
    m["counts"]["items"] = 29
    save_manifest(b, m)


def _recount(b: Path, **counts: int) -> None:
    m = load_manifest(b)
    m["counts"].update(counts)
    save_manifest(b, m)


def _status_counts_off(b: Path) -> None:
    m = load_manifest(b)
    m["counts"]["accepted"] += 1
    m["counts"]["failed"] -= 1
    save_manifest(b, m)


def _outstanding_table(table: pa.Table) -> Callable[[Path], None]:
    def corrupt(b: Path) -> None:
        rewrite_part(b, OUT, table)

    return corrupt


def _deep_dirs(b: Path) -> None:
    nest(b / "deep", 1200)  # os.walk recursed one frame a level


def _x_valid(m: dict) -> None:
    m["schema"]["fields"][1]["nullable"] = True  # x, nullable
    m["schema"]["fields"].insert(2, {"name": "x__valid", "type": "bool", "nullable": False})


def malformed_bundles() -> list[Malformed]:
    """Every malformed bundle of the corpus, in a stable order (names are unique)."""
    M = Malformed
    # fmt: off
    cases = [
        # -- json: the manifest text is not (UTF-8) JSON, or is hostile JSON
        M("empty manifest", "json", _text(b""), "ManifestInvalid"),
        M("not JSON", "json", _text(b"nope"), "ManifestInvalid"),
        M("truncated JSON", "json", _text(lambda m: _json(m).encode()[:200]), "ManifestInvalid"),
        M("trailing garbage", "json", _text(lambda m: _json(m).encode() + b" x"), "ManifestInvalid"),
        M("top-level array", "json", _text(b"[]"), "ManifestInvalid"),
        M("top-level null", "json", _text(b"null"), "ManifestInvalid"),
        M("JSON with a comment", "json", _text(b'// c\n{"kind": "input"}'), "ManifestInvalid"),
        M("UTF-16 with BOM", "json", _text(lambda m: _json(m).encode("utf-16")), "ManifestInvalid"),
        M("UTF-16-LE", "json", _text(lambda m: _json(m).encode("utf-16-le")), "ManifestInvalid"),
        M("UTF-32", "json", _text(lambda m: _json(m).encode("utf-32")), "ManifestInvalid"),
        M("UTF-8 BOM", "json", _text(lambda m: b"\xef\xbb\xbf" + _json(m).encode()), "ManifestInvalid"),
        M("Latin-1 byte", "json", _text(lambda m: _json(m).replace("job-1", "job-\xe9").encode("latin-1")), "ManifestInvalid"),
        M("lone surrogate escape", "json", _replace_in_text('"job-1"', '"\\ud800"'), "ManifestInvalid"),
        M("raw control character", "json", _replace_in_text('"job-1"', '"job\x01"'), "ManifestInvalid"),
        M("200,000-deep nesting", "json", _text(_nested_json(200_000)), "ManifestInvalid"),
        M("5,000-digit integer", "json", _replace_in_text('"items": 30', '"items": ' + "9" * 5000), "ManifestInvalid"),
        M("NaN", "json", _replace_in_text('"items": 30', '"items": NaN'), "ManifestInvalid"),
        M("Infinity", "json", _replace_in_text('"attempt": 1', '"attempt": Infinity'), "ManifestInvalid"),
        M("duplicate key", "json", _replace_in_text('"kind": "result"', '"kind": "input", "kind": "result"'), "ManifestInvalid"),
        M("manifest over 64 MiB", "json", _sparse_manifest, "ManifestInvalid"),
        # -- model: JSON that breaks the v1 model (strict types, bounds, rules)
        M("string number bytes", "model", _set("parts.0.bytes", "1034"), "ManifestInvalid"),
        M("string number rows", "model", _set("parts.1.rows", "10"), "ManifestInvalid"),
        M("string number items", "model", _set("counts.items", "30"), "ManifestInvalid"),
        M("float number rows", "model", _set("parts.0.rows", 10.0), "ManifestInvalid"),
        M("manifest_version true", "model", _set("manifest_version", True), "ManifestInvalid"),
        M("manifest_version 2", "model", _set("manifest_version", 2), "ManifestInvalid"),
        M("manifest_version string", "model", _set("manifest_version", "1"), "ManifestInvalid"),
        M("manifest_version missing", "model", _drop("manifest_version"), "ManifestInvalid"),
        M("nullable yes", "model", _field(1, nullable="yes"), "ManifestInvalid"),
        M("nullable 1", "model", _field(1, nullable=1), "ManifestInvalid"),
        M("created_at epoch number", "model", _set("created_at", 1_790_000_000), "ManifestInvalid"),
        M("created_at epoch text", "model", _set("created_at", "1790000000"), "ManifestInvalid"),
        M("created_at naive", "model", _set("created_at", "2026-09-05T12:00:00"), "ManifestInvalid"),
        M("created_at not UTC", "model", _set("created_at", "2026-09-05T12:00:00+02:00"), "ManifestInvalid"),
        M("created_at a date", "model", _set("created_at", "2026-09-05"), "ManifestInvalid"),
        M("count beyond int64", "model", _set("parts.0.bytes", 2**63), "ManifestInvalid"),
        M("negative rows", "model", _set("parts.0.rows", -1), "ManifestInvalid"),
        M("attempt 0", "model", _set("job.attempt", 0), "ManifestInvalid"),
        M("unknown kind", "model", _set("kind", "model"), "ManifestInvalid"),
        M("extra top-level key", "model", _set("extra", 1), "ManifestInvalid"),
        M("extra key in a file entry", "model", _set("parts.0.mode", "0644"), "ManifestInvalid"),
        M("counts missing", "model", _drop("counts"), "ManifestInvalid"),
        M("sha256 uppercase", "model", _edit(lambda m: m["parts"][0].update(sha256=m["parts"][0]["sha256"].upper())), "ManifestInvalid"),
        M("sha256 short", "model", _set("parts.0.sha256", "abc"), "ManifestInvalid"),
        M("content_sha256 not hex", "model", _set("snapshot.content_sha256", "z" * 64), "ManifestInvalid"),
        M("version_id empty", "model", _set("snapshot.version_id", ""), "ManifestInvalid"),
        M("version_id traversal", "model", _set("snapshot.version_id", "../../etc/x"), "ManifestInvalid"),
        M("version_id with a slash", "model", _set("snapshot.version_id", "a/b"), "ManifestInvalid"),
        M("version_id with a newline", "model", _set("snapshot.version_id", "v1\nVALID x"), "ManifestInvalid"),
        M("version_id 300 characters", "model", _set("snapshot.version_id", "v" * 300), "ManifestInvalid"),
        M("parent_version_id traversal", "model", _set("job.parent_version_id", "../x"), "ManifestInvalid"),
        M("input version_id traversal", "model", _set("input.version_id", "../x"), "ManifestInvalid"),
        M("job_id 5,000 characters", "model", _set("job.job_id", "j" * 5000), "ManifestInvalid"),
        M("unknown type", "model", _field(1, type="decimal128(10,2)"), "ManifestInvalid"),
        M("list size beyond int32", "model", _field(1, type="fixed_size_list<int8,99999999999>"), "ManifestInvalid"),
        M("list size of 5,000 digits", "model", _field(1, type=f"fixed_size_list<int8,{'9' * 5000}>"), "ManifestInvalid"),
        M("list size 0", "model", _field(1, type="fixed_size_list<int8,0>"), "ManifestInvalid"),
        M("list of lists", "model", _field(1, type="list<list<int8>>"), "ManifestInvalid"),
        M("duplicate column name", "model", _field(1, name="id"), "ManifestInvalid"),
        M("no columns", "model", _set("schema.fields", []), "ManifestInvalid"),
        M("item_id_field undeclared", "model", _set("item_id_field", "nope"), "ManifestInvalid"),
        M("id declared int64", "model", _field(0, type="int64"), "ManifestInvalid"),
        M("id declared nullable", "model", _field(0, nullable=True), "ManifestInvalid"),
        M("x__valid beside nullable x", "model", _edit(_x_valid), "ManifestInvalid"),
        M("part at the wrong path", "model", _set("parts.0.path", P1), "ManifestInvalid"),
        M("absolute part path", "model", _set("parts.0.path", "/etc/passwd"), "UnsafePath"),
        M("part path with ..", "model", _set("parts.0.path", "parts/../../x.parquet"), "UnsafePath"),
        M("part path with a backslash", "model", _set("parts.0.path", "parts\\part-00000.parquet"), "UnsafePath"),
        M("part path with ./", "model", _set("parts.0.path", "./parts/part-00000.parquet"), "UnsafePath"),
        M("outstanding at another path", "model", _set("outstanding.path", "parts/out.parquet"), "ManifestInvalid"),
        M("counts.items off", "model", _set("counts.items", 31), "CountMismatch"),
        M("statuses do not sum to items", "model", _edit(lambda m: m["counts"].update(failed=m["counts"]["failed"] + 1)), "CountMismatch"),
        M("result without job", "model", _set("job", None), "ManifestInvalid"),
        M("input with a job", "model", _set("kind", "input"), "ManifestInvalid"),
        M("input bundle naming an input", "model", _set("input", {"version_id": "v", "content_sha256": "a" * 64, "credential_ref": None}), "ManifestInvalid", "input"),
        M("result counts in an input", "model", _set("counts.failed", 0), "ManifestInvalid", "input"),
        M("PARTIAL without outstanding", "model", _edit(lambda m: m.update(outstanding=None) or m["counts"].update(outstanding=0)), "StatusMismatch"),
        M("outstanding without PARTIAL", "model", _edit(lambda m: m["job"].update(status="SUCCEEDED", next_action=None)), "StatusMismatch"),
        M("next_action items off", "model", _set("job.next_action.items", 5), "StatusMismatch"),
        M("PARTIAL without next_action", "model", _set("job.next_action", None), "StatusMismatch"),
        M("result without lithi columns", "model", _edit(lambda m: m["schema"].update(fields=m["schema"]["fields"][: 2])), "ManifestInvalid"),
        M("lithi_status declared int64", "model", _field(2, type="int64"), "ManifestInvalid"),
        M("parts as an object", "model", _set("parts", {"0": "x"}), "ManifestInvalid"),
        # -- tree: what the directory holds
        M("no manifest", "tree", lambda b: (b / MANIFEST).unlink(), "IncompleteBundle"),
        M("a file, not a directory", "tree", _not_a_directory, "IncompleteBundle"),
        M("manifest is a directory", "tree", _manifest_is("dir"), "UnsafePath"),
        M("manifest is a symlink", "tree", _manifest_is("symlink"), "UnsafePath"),
        M("manifest is a FIFO", "tree", _manifest_is("fifo"), "UnsafePath"),
        M("extra file", "tree", _file("stray.txt", b"x"), "UnboundFile"),
        M("hidden extra file", "tree", _file(".hidden"), "UnboundFile"),
        M("extra file in parts", "tree", _file("parts/part-00003.parquet", b"x"), "UnboundFile"),
        M("extra directory", "tree", lambda b: (b / "more").mkdir(), "UnboundFile"),
        M("1,200 nested unbound directories", "tree", _deep_dirs, "UnboundFile"),
        M("1,100 stray files", "tree", _many_files(1100), "UnboundFile"),
        M("symlinked parts directory", "tree", _symlinked_parts, "UnsafePath"),
        M("parts is a file", "tree", _parts_is_a_file, "UnboundFile"),
        M("part is a symlink", "tree", _replace_path(P1, "symlink"), "UnsafePath"),
        M("part is a directory", "tree", _replace_path(P1, "dir"), "UnboundFile"),
        M("part is a FIFO", "tree", _replace_path(P1, "fifo"), "UnsafePath"),
        M("missing part", "tree", _replace_path(P1, "gone"), "MissingFile"),
        M("missing outstanding", "tree", _replace_path(OUT, "gone"), "MissingFile"),
        M("non-UTF-8 file name", "tree", _raw_name(b"stray-\xff\xfe"), "UnboundFile"),
        M("file name forging a VALID line", "tree", _raw_name(b"x\nVALID elsewhere\n"), "UnboundFile"),
        M("file name with terminal escapes", "tree", _raw_name(b"\x1b[2J\x1b[31mred\xe2\x80\xae"), "UnboundFile"),
        # -- bytes: the bound files' bytes
        M("truncated part", "bytes", _bytes(P1, lambda d: d[:-10]), "SizeMismatch"),
        M("extended part", "bytes", _bytes(P1, lambda d: d + b"\0"), "SizeMismatch"),
        M("flipped byte", "bytes", _bytes(P1, _flip), "DigestMismatch"),
        M("flipped byte in outstanding", "bytes", _bytes(OUT, _flip), "DigestMismatch"),
        M("wrong content_sha256", "bytes", _set("snapshot.content_sha256", "0" * 64), "DigestMismatch"),
        M("entry sha256 of another file", "bytes", _edit(lambda m: m["parts"][0].update(sha256=m["parts"][1]["sha256"])), "DigestMismatch"),
        M("empty part, rebound", "bytes", _bytes(P1, lambda d: b"", rebound=True), "SchemaMismatch"),
        M("garbage part, rebound", "bytes", _bytes(P1, lambda d: b"x" * len(d), rebound=True), "SchemaMismatch"),
        M("footer magic cut, rebound", "bytes", _bytes(P1, lambda d: d[: - 4], rebound=True), "SchemaMismatch"),
        # -- parquet: the files parse, but say something else than the manifest
        M("footer rows disagree with row groups", "parquet", _footer_lies, "RowCountMismatch", "input"),
        M("manifest rows off", "parquet", _edit(lambda m: (m["parts"][0].update(rows=9), m["parts"][1].update(rows=11))), "RowCountMismatch"),
        M("wrecked pages, footer kept", "parquet", _bytes(P1, _wreck_pages, rebound=True), "SchemaMismatch"),
        M("renamed column", "parquet", _table(P1, lambda t: t.rename_columns(["id", "xx", *t.column_names[2:]])), "SchemaMismatch"),
        M("reordered columns", "parquet", _table(P1, lambda t: t.select([1, 0, *range(2, t.num_columns)])), "SchemaMismatch"),
        M("changed type", "parquet", _table(P1, lambda t: _column(t, "x", t.column("x").to_pylist(), pa.int32())), "SchemaMismatch"),
        M("changed nullability", "parquet", _table(P1, lambda t: t.cast(pa.schema([f.with_nullable(True) for f in t.schema]))), "SchemaMismatch"),
        M("extra column", "parquet", _table(P1, lambda t: t.append_column("z", pa.array([1] * t.num_rows))), "SchemaMismatch"),
        M("missing column", "parquet", _table(P1, lambda t: t.drop_columns(["x"])), "SchemaMismatch"),
        M("id column int64", "parquet", _table(P1, lambda t: _column(t, "id", list(range(t.num_rows)), pa.int64())), "SchemaMismatch"),
        M("null id", "parquet", _table(P1, lambda t: _ids(t, lambda ids: ids.__setitem__(3, None))), "IdentifierError"),
        M("lithi_status int64", "parquet", _table(P1, lambda t: _column(t, fmt.STATUS_COLUMN, [1] * t.num_rows, pa.int64())), "SchemaMismatch"),
        M("outstanding with two columns", "parquet", _outstanding_table(pa.table({"id": ["late-1", "late-2"], "x": [1, 2]})), "SchemaMismatch"),
        M("outstanding ids int64", "parquet", _outstanding_table(pa.table({"id": pa.array([1, 2], pa.int64())})), "SchemaMismatch"),
        # -- ids and statuses
        M("duplicate id across parts", "ids", _table(P1, lambda t: _ids(t, lambda ids: ids.__setitem__(4, "item-00002"))), "DuplicateIds"),
        M("duplicate id within a part", "ids", _table(P1, lambda t: _ids(t, lambda ids: ids.__setitem__(4, ids[3]))), "DuplicateIds"),
        M("outstanding id also in a part", "ids", _outstanding_table(pa.table({"id": pa.array(["late-1", "item-00003"])}).cast(pa.schema([pa.field("id", pa.string(), False)]))), "DuplicateIds"),
        M("duplicate id forging a VALID line", "ids", _table(P1, lambda t: _ids(t, lambda ids: ids.__setitem__(slice(0, 2), ["x\nVALID /elsewhere"] * 2))), "DuplicateIds"),
        M("unknown status", "ids", _table(P1, lambda t: _column(t, fmt.STATUS_COLUMN, ["unsure"] * t.num_rows)), "CountMismatch"),
        M("null status", "ids", _table(P1, lambda t: _column(t, fmt.STATUS_COLUMN, [None] * t.num_rows)), "CountMismatch"),
        M("status counts off", "ids", _status_counts_off, "CountMismatch"),
    ]
    # fmt: on
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


# -- bad staging inputs --------------------------------------------------------------------------


@dataclass(frozen=True)
class BadStaging:
    """One bad ``lithi-bundle stage`` call: files to make, the arguments, the exit code."""

    name: str
    args: list[str]  # "{dir}" is the case's directory; the command is "stage"
    exit: int
    files: dict[str, Callable[[Path], None]] = field(default_factory=dict)


def _parquet(table: pa.Table) -> Callable[[Path], None]:
    return lambda p: pq.write_table(table, p)


def _bytes_file(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


def _schema(fields: list[dict]) -> Callable[[Path], None]:
    return lambda p: p.write_text(json.dumps({"fields": fields}))


def _input_dir(p: Path) -> None:
    make_input(p, n=5)


def _broken_input_dir(p: Path) -> None:
    make_input(p, n=5)
    write_bytes(p / P0, _flip((p / P0).read_bytes()))


_ID_X = [
    {"name": "id", "type": "string", "nullable": False},
    {"name": "x", "type": "int64", "nullable": True},
]
_RESULT = _parquet(result_table(6))
_INPUT = _parquet(input_table(6))
_STAGE_INPUT = ["{dir}/t.parquet", "--id-field", "id", "--kind", "input", "--out", "{dir}/b"]
_STAGE_RESULT = [
    "{dir}/r.parquet", "--id-field", "id", "--kind", "result", "--out", "{dir}/b",
    "--input-version-id", "input-v1", "--input-sha256", "a" * 64, "--job-id", "job-1",
]  # fmt: skip
_STAGE_PRED = [
    "{dir}/t.parquet", "--id-field", "id", "--kind", "prediction", "--out", "{dir}/b",
    "--input-version-id", "input-v1", "--input-sha256", "a" * 64,
]  # fmt: skip


def _one(column: pa.Array) -> Callable[[Path], None]:
    return _parquet(pa.table({"id": [f"i{k}" for k in range(len(column))], "c": column}))


def bad_staging_inputs() -> list[BadStaging]:
    """Every bad staging input of the corpus (names are unique)."""
    B = BadStaging
    t = {"t.parquet": _INPUT}
    r = {"r.parquet": _RESULT}
    dup = {"t.parquet": _parquet(pa.table({"id": ["a", "b", "a"]}))}
    dup_parts = {"t.parquet": _parquet(pa.table({"id": [f"i{k % 7}" for k in range(20)]}))}
    csv_files = {"t.csv": _bytes_file(b'id,x\n"a",1\n"b",two\n'), "s.json": _schema(_ID_X)}
    # fmt: off
    cases = [
        B("table missing", _STAGE_INPUT, 2),
        B("table is a directory", _STAGE_INPUT, 2, {"t.parquet": lambda p: p.mkdir()}),
        B("table not Parquet", _STAGE_INPUT, 2, {"t.parquet": _bytes_file(b"garbage" * 10)}),
        B("table empty file", _STAGE_INPUT, 2, {"t.parquet": _bytes_file(b"")}),
        B("unknown suffix", ["{dir}/t.txt", *_STAGE_INPUT[1:]], 2, {"t.txt": _INPUT}),
        B("Parquet read as CSV", [*_STAGE_INPUT, "--format", "csv", "--schema", "{dir}/s.json"], 2, {**t, "s.json": _schema(_ID_X)}),
        B("CSV without --schema", ["{dir}/t.csv", *_STAGE_INPUT[1:]], 2, {"t.csv": _bytes_file(b"id\na\n")}),
        B("JSON Lines without --schema", ["{dir}/t.jsonl", *_STAGE_INPUT[1:]], 2, {"t.jsonl": _bytes_file(b'{"id": "a"}\n')}),
        B("schema file missing", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.csv": _bytes_file(b"id\na\n")}),
        B("schema file not JSON", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.csv": _bytes_file(b"id\na\n"), "s.json": _bytes_file(b"{")}),
        B("schema type unknown", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.csv": _bytes_file(b"id\na\n"), "s.json": _schema([{"name": "id", "type": "text", "nullable": False}])}),
        B("schema nullable yes", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.csv": _bytes_file(b"id\na\n"), "s.json": _schema([{"name": "id", "type": "string", "nullable": "yes"}])}),
        B("CSV header not the schema", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.csv": _bytes_file(b"id,y\na,1\n"), "s.json": _schema(_ID_X)}),
        B("CSV value not of its type", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, csv_files),
        B("CSV null in a non-null column", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.csv": _bytes_file(b'id,x\n"a",1\n,2\n'), "s.json": _schema(_ID_X)}),
        B("CSV list column", ["{dir}/t.csv", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.csv": _bytes_file(b'id,x\n"a","[1]"\n'), "s.json": _schema([_ID_X[0], {"name": "x", "type": "list<int64>", "nullable": True}])}),
        B("JSON Lines bad line", ["{dir}/t.jsonl", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.jsonl": _bytes_file(b'{"id": "a", "x": 1}\n{"id": \n'), "s.json": _schema(_ID_X)}),
        B("JSON Lines undeclared key", ["{dir}/t.jsonl", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.jsonl": _bytes_file(b'{"id": "a", "x": 1, "z": 2}\n'), "s.json": _schema(_ID_X)}),
        B("JSON Lines binary column", ["{dir}/t.jsonl", *_STAGE_INPUT[1:], "--schema", "{dir}/s.json"], 2, {"t.jsonl": _bytes_file(b'{"id": "a", "x": "b"}\n'), "s.json": _schema([_ID_X[0], {"name": "x", "type": "binary", "nullable": True}])}),
        B("id column missing", [*_STAGE_INPUT[:2], "nope", *_STAGE_INPUT[3:]], 2, t),
        B("id column int64", _STAGE_INPUT, 2, {"t.parquet": _parquet(pa.table({"id": [1, 2]}))}),
        B("null id", _STAGE_INPUT, 2, {"t.parquet": _parquet(pa.table({"id": ["a", None]}))}),
        B("duplicate ids", _STAGE_INPUT, 2, dup),
        B("duplicate ids across parts", [*_STAGE_INPUT, "--rows-per-part", "5"], 2, dup_parts),
        B("id forging a VALID line", _STAGE_INPUT, 2, {"t.parquet": _parquet(pa.table({"id": ["x\nVALID /elsewhere"] * 2}))}),
        B("result without lithi columns", _STAGE_RESULT, 2, {"r.parquet": _INPUT}),
        B("result lithi_status int64", _STAGE_RESULT, 2, {"r.parquet": _parquet(result_table(6).set_column(2, fmt.STATUS_COLUMN, pa.array([1] * 6)))}),
        B("result unknown status", _STAGE_RESULT, 2, {"r.parquet": _parquet(result_table(6).set_column(2, fmt.STATUS_COLUMN, pa.array(["unsure"] * 6)))}),
        B("result null status", _STAGE_RESULT, 2, {"r.parquet": _parquet(result_table(6).set_column(2, fmt.STATUS_COLUMN, pa.array([None] * 6, pa.string())))}),
        B("decimal column", _STAGE_INPUT, 2, {"t.parquet": _one(pa.array([1], pa.decimal128(5, 2)))}),
        B("struct column", _STAGE_INPUT, 2, {"t.parquet": _one(pa.array([{"a": 1}]))}),
        B("list of lists", _STAGE_INPUT, 2, {"t.parquet": _one(pa.array([[[1]]]))}),
        B("timestamp without a zone", _STAGE_INPUT, 2, {"t.parquet": _one(pa.array([0], pa.timestamp("us")))}),
        B("timestamp[ns] below a microsecond", _STAGE_INPUT, 2, {"t.parquet": _one(pa.array([1], pa.timestamp("ns", tz="UTC")))}),
        B("x__valid beside nullable x", _STAGE_INPUT, 2, {"t.parquet": _parquet(input_table(3).append_column("x__valid", pa.array([True] * 3)))}),
        B("--out exists as a directory", _STAGE_INPUT, 2, {**t, "b": lambda p: p.mkdir()}),
        B("--out exists as a file", _STAGE_INPUT, 2, {**t, "b": _bytes_file(b"x")}),
        B("--out a dangling symlink", _STAGE_INPUT, 2, {**t, "b": lambda p: os.symlink(p.parent / "nowhere", p)}),
        B("--out under a regular file", [*_STAGE_INPUT[: - 1], "{dir}/f/sub/b"], 2, {**t, "f": _bytes_file(b"x")}),
        B("--rows-per-part 0", [*_STAGE_INPUT, "--rows-per-part", "0"], 2, t),
        B("--rows-per-part not a number", [*_STAGE_INPUT, "--rows-per-part", "ten"], 2, t),
        B("--version-id empty", [*_STAGE_INPUT, "--version-id", ""], 2, t),
        B("--version-id traversal", [*_STAGE_INPUT, "--version-id", "../../etc/x"], 2, t),
        B("--version-id with a newline", [*_STAGE_INPUT, "--version-id", "v\nVALID x"], 2, t),
        B("--version-id 300 characters", [*_STAGE_INPUT, "--version-id", "v" * 300], 2, t),
        B("--input-bundle missing", [*_STAGE_PRED[:7], "--input-bundle", "{dir}/in"], 2, t),
        B("--input-bundle and --input-version-id", [*_STAGE_PRED, "--input-bundle", "{dir}/in"], 2, {**t, "in": _input_dir}),
        B("--input-sha256 not hex", [*_STAGE_PRED[:9], "--input-sha256", "xyz"], 2, t),
        B("--input-version-id traversal", [*_STAGE_PRED[: 7], "--input-version-id", "../x", "--input-sha256", "a" * 64], 2, t),
        B("prediction without an input", _STAGE_PRED[:7], 2, t),
        B("result without --job-id", _STAGE_RESULT[:-2], 2, r),
        B("--attempt 0", [*_STAGE_RESULT, "--attempt", "0"], 2, r),
        B("--parent-version-id traversal", [*_STAGE_RESULT, "--parent-version-id", "../x"], 2, r),
        B("--outstanding missing", [*_STAGE_RESULT, "--outstanding", "{dir}/o.parquet"], 2, r),
        B("--outstanding not Parquet", [*_STAGE_RESULT, "--outstanding", "{dir}/o.parquet"], 2, {**r, "o.parquet": _bytes_file(b"id\nlate\n")}),
        B("--outstanding without the id column", [*_STAGE_RESULT, "--outstanding", "{dir}/o.parquet"], 2, {**r, "o.parquet": _parquet(pa.table({"item": ["late"]}))}),
        B("--outstanding ids int64", [*_STAGE_RESULT, "--outstanding", "{dir}/o.parquet"], 2, {**r, "o.parquet": _parquet(pa.table({"id": [1]}))}),
        B("--outstanding id also in the table", [*_STAGE_RESULT, "--outstanding", "{dir}/o.parquet"], 2, {**r, "o.parquet": _parquet(pa.table({"id": ["item-00001"]}))}),
        B("--outstanding for an input", [*_STAGE_INPUT, "--outstanding", "{dir}/o.parquet"], 2, {**t, "o.parquet": _parquet(pa.table({"id": ["late"]}))}),
        B("--credential-ref for an input", [*_STAGE_INPUT, "--credential-ref", "ref"], 2, t),
        B("--job-status for a prediction", [*_STAGE_PRED, "--job-status", "FAILED"], 2, t),
        B("--format unknown", [*_STAGE_INPUT, "--format", "xlsx"], 2, t),
        B("--kind unknown", [*_STAGE_INPUT[:4], "model", *_STAGE_INPUT[5:]], 2, t),
        B("--id-field missing", [_STAGE_INPUT[0], *_STAGE_INPUT[3:]], 2, t),
        B("unknown flag", [*_STAGE_INPUT, "--force"], 2, t),
        B("--input-bundle not a bundle", [*_STAGE_PRED[: 7], "--input-bundle", "{dir}/in"], 1, {**t, "in": lambda p: p.mkdir()}),
        B("--input-bundle corrupt", [*_STAGE_PRED[: 7], "--input-bundle", "{dir}/in"], 1, {**t, "in": _broken_input_dir}),
    ]
    # fmt: on
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


def prepare(case: BadStaging, d: Path) -> list[str]:
    """Make the case's files under ``d``; return the full ``lithi-bundle`` argv."""
    for name, make in case.files.items():
        make(d / name)
    return ["stage", *(a.replace("{dir}", str(d)) for a in case.args)]


def listing(d: Path) -> list[str]:
    """Everything under ``d`` (names, recursively, sorted): what a failed command may not add."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# -- the report ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one CLI call did: its exit code, stdout and stderr lines, an escaped exception."""

    code: int | None
    out: str
    err: str
    crash: str | None = None


def run_cli(argv: list[str]) -> Outcome:
    """Run ``lithi-bundle`` in-process with a strict ASCII stdout; an exception is a crash."""
    from pipeline.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    crash = None
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException as e:  # what the corpus exists to find
            crash = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
            if os.environ.get("CORPUS_TRACEBACKS"):
                traceback.print_exc(file=sys.__stderr__)
    texts = []
    for stream in (out, err):
        stream.flush()
        texts.append(stream.buffer.getvalue().decode("ascii", "backslashreplace"))
    return Outcome(code, texts[0], texts[1], crash)


def _report() -> None:
    """Build the corpus in a temporary directory, run the CLI on every case, print the counts."""
    ap = argparse.ArgumentParser(description=_report.__doc__)
    ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bases = pristine(tmp / "bases")
        cases = malformed_bundles()
        print(f"malformed bundles: {len(cases)}")
        print("  by group:", dict(Counter(c.group for c in cases)))
        print("  by expected first violation:", dict(Counter(c.expect for c in cases)))
        tally: Counter[str] = Counter()
        for i, case in enumerate(cases):
            b = build(case, bases, tmp / f"m{i:03d}" / "b")
            for argv, what in (
                (["verify", str(b)], "verify"),
                (["verify", "--json", str(b)], "verify --json"),
                (["inspect", str(b)], "inspect"),
            ):
                o = run_cli(argv)
                if o.crash:
                    tally[f"{what}: traceback"] += 1
                    print(f"  TRACEBACK {what} [{case.name}]: {o.crash}")
                else:
                    tally[f"{what}: exit {o.code}"] += 1
                    if what == "verify" and o.code == 0:
                        print(f"  ACCEPTED although invalid [{case.name}]")
                if what == "verify --json" and not o.crash:
                    try:
                        json.loads(o.out)
                    except ValueError:
                        tally["verify --json: not JSON"] += 1
            with contextlib.suppress(OSError):  # nest() made a tree rmtree cannot recurse into
                from tests.helpers.bundles import unnest

                unnest(b / "deep")
        for k in sorted(tally):
            print(f"  {k}: {tally[k]}")
        staging = bad_staging_inputs()
        print(f"bad staging inputs: {len(staging)}")
        tally = Counter()
        for i, case in enumerate(staging):
            d = tmp / f"s{i:03d}"
            d.mkdir()
            argv = prepare(case, d)
            before = listing(d)
            o = run_cli(argv)
            if o.crash:
                tally["traceback"] += 1
                print(f"  TRACEBACK [{case.name}]: {o.crash}")
            else:
                tally[f"exit {o.code} (expected {case.exit})"] += 1
                if o.code != case.exit:
                    print(f"  EXIT {o.code} != {case.exit} [{case.name}]: {o.err.strip()[:160]}")
                if o.err.count("\n") != 1:
                    tally["stderr not one line"] += 1
            if listing(d) != before:
                tally["left something behind"] += 1
        for k in sorted(tally):
            print(f"  {k}: {tally[k]}")


if __name__ == "__main__":
    _report()
