"""``lithi-bundle``: exit codes, every violation listed, JSON for machines, streaming stage."""

from __future__ import annotations

import io
import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import SchemaMismatch
from pipeline.bundle.manifest import Schema
from pipeline.bundle.stage import stage
from pipeline.bundle.verify import verify
from pipeline.cli import main
from pipeline.cli.output import progress_bar
from tests.helpers.bundles import input_table, make_input, result_table, schema_file_text


@pytest.fixture
def bundle(tmp_path):
    make_input(tmp_path / "b", n=30, rows_per_part=10)
    return tmp_path / "b"


def test_verify_valid(bundle, capsys):
    assert main(["verify", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"VALID {bundle}")
    assert verify(bundle).identity.content_sha256 in out


def test_verify_lists_every_violation(bundle, capsys):
    (bundle / "stray.txt").write_text("x")
    (bundle / fmt.part_path(2)).unlink()
    assert main(["verify", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "2 violation(s)" in out
    assert "UnboundFile" in out and "stray.txt" in out
    assert "MissingFile" in out and "part-00002.parquet" in out


def test_verify_json(bundle, capsys):
    (bundle / "stray.txt").write_text("x")
    assert main(["verify", "--json", str(bundle)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert [e["type"] for e in report["errors"]] == ["UnboundFile"]
    assert report["errors"][0]["path"] == "stray.txt"
    assert report["snapshot"]["version_id"] == verify_manifest_id(bundle)


def verify_manifest_id(bundle) -> str:
    return json.loads((bundle / fmt.MANIFEST_NAME).read_text())["snapshot"]["version_id"]


def test_verify_json_valid_has_stats(bundle, capsys):
    assert main(["verify", "--json", str(bundle)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and report["errors"] == []
    assert report["stats"]["files_hashed"] == 3


def test_verify_incomplete_bundle_reads_as_incomplete(bundle, capsys):
    (bundle / fmt.MANIFEST_NAME).unlink()
    assert main(["verify", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "IncompleteBundle" in out and "part files alone never mean the job finished" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["verify"],
        ["verify", "{missing}"],
        ["inspect", "{missing}"],
        ["stage", "{missing}", "--id-field", "id", "--kind", "input", "--out", "{out}"],
    ],
)
def test_usage_errors_exit_2(tmp_path, argv, capsys):
    argv = [a.format(missing=tmp_path / "missing", out=tmp_path / "o") for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err


def test_inspect_shows_identity_counts_schema_parts(bundle, capsys):
    assert main(["inspect", str(bundle)]) == 0
    out = capsys.readouterr().out
    m = verify(bundle).manifest
    assert m.snapshot.version_id in out and m.snapshot.content_sha256 in out
    assert "items=30" in out
    for f in m.schema_.fields:
        assert f.name in out
    for p in m.parts:
        line = next(x for x in out.splitlines() if x.startswith(p.path))
        assert line.split()[1:] == [str(p.rows), str(p.bytes), p.sha256]


def test_inspect_json_is_the_manifest(bundle, capsys):
    assert main(["inspect", "--json", str(bundle)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        (bundle / fmt.MANIFEST_NAME).read_text()
    )


def test_inspect_invalid_manifest_exits_1(bundle, capsys):
    (bundle / fmt.MANIFEST_NAME).write_text("nope")
    assert main(["inspect", str(bundle)]) == 1
    assert "ManifestInvalid" in capsys.readouterr().err


def _replace(path, how, tmp_path):
    """Put something unsafe where ``path`` was: a symlink (absolute or relative) or a FIFO."""
    if path.is_dir():
        target = tmp_path / "elsewhere"
        path.rename(target)
    else:
        target = tmp_path / f"copy-of-{path.name}"
        target.write_bytes(path.read_bytes())
        path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "absolute":
        os.symlink(target, path)
    elif how == "relative":
        os.symlink(os.path.relpath(target, path.parent), path)
    else:
        os.symlink(how, path)  # a file outside any bundle


UNSAFE = {
    "part to /etc/passwd": ("parts/part-00000.parquet", "/etc/passwd"),
    "part absolute": ("parts/part-00000.parquet", "absolute"),
    "part relative": ("parts/part-00001.parquet", "relative"),
    "part fifo": ("parts/part-00002.parquet", "fifo"),
    "parts folder absolute": ("parts", "absolute"),
    "parts folder relative": ("parts", "relative"),
    "manifest to /etc/passwd": (fmt.MANIFEST_NAME, "/etc/passwd"),
    "manifest absolute": (fmt.MANIFEST_NAME, "absolute"),
    "manifest relative": (fmt.MANIFEST_NAME, "relative"),
    "manifest fifo": (fmt.MANIFEST_NAME, "fifo"),
}


@pytest.mark.parametrize("case", list(UNSAFE))
def test_inspect_refuses_every_unsafe_path_verify_refuses(bundle, tmp_path, capsys, case):
    rel, how = UNSAFE[case]
    _replace(bundle / rel, how, tmp_path)
    assert main(["verify", str(bundle)]) == 1
    refused = [line for line in capsys.readouterr().out.splitlines() if "UnsafePath" in line]
    assert refused, case
    assert main(["inspect", str(bundle)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed as if it were a bundle
    line = captured.err.strip()
    assert "\n" not in line and line.endswith(refused[0].split("UnsafePath: ", 1)[1]), line


def test_stage_input_streams_and_prints_identity(tmp_path, capsys):
    table = tmp_path / "t.parquet"
    pq.write_table(input_table(100), table, row_group_size=7)  # many small batches
    out_dir = tmp_path / "b"
    argv = ["stage", str(table), "--id-field", "id", "--kind", "input", "--out", str(out_dir)]
    assert main([*argv, "--rows-per-part", "40"]) == 0
    out = capsys.readouterr().out
    snap = verify(out_dir)
    assert snap.identity.version_id in out and snap.identity.content_sha256 in out
    assert [p.rows for p in snap.manifest.parts] == [40, 40, 20]
    # Refuses to overwrite, and leaves the bundle as it was.
    assert main(argv) == 2
    assert verify(out_dir).identity == snap.identity


def test_stage_result_partial_from_input_bundle(tmp_path, capsys):
    inp = make_input(tmp_path / "in", n=30)
    table, ids = tmp_path / "r.parquet", tmp_path / "o.parquet"
    pq.write_table(result_table(28), table)
    pq.write_table(pa.table({"id": ["item-00028", "item-00029"]}), ids)
    out_dir = tmp_path / "r"
    argv = ["stage", str(table), "--id-field", "id", "--kind", "result", "--out", str(out_dir)]
    argv += ["--input-bundle", str(inp.root), "--job-id", "job-9", "--outstanding", str(ids)]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    m = verify(out_dir).manifest
    assert printed["snapshot"] == m.snapshot.model_dump()
    assert m.input.snapshot == inp.identity
    assert m.job.status == "PARTIAL" and m.job.next_action.items == 2
    assert m.counts.outstanding == 2 and m.counts.items == 28


@pytest.mark.parametrize(
    ("kind", "extra", "message"),
    [
        ("result", [], "must name its input"),
        ("result", ["--input-version-id", "v", "--input-sha256", "a" * 64], "needs --job-id"),
        ("prediction", ["--input-version-id", "v"], "both"),
        ("prediction", ["--input-version-id", "v", "--input-sha256", "xyz"], "bad input"),
        ("input", ["--input-version-id", "v"], "derives from nothing"),
        ("input", ["--job-id", "j"], "only for kind result"),
    ],
)
def test_stage_lineage_flags(tmp_path, capsys, kind, extra, message):
    table = tmp_path / "t.parquet"
    pq.write_table(input_table(5), table)
    argv = ["stage", str(table), "--id-field", "id", "--kind", kind, "--out", str(tmp_path / "o")]
    assert main([*argv, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_stage_prediction(tmp_path, capsys):
    table = tmp_path / "t.parquet"
    pq.write_table(input_table(5), table)
    argv = ["stage", str(table), "--id-field", "id", "--kind", "prediction"]
    argv += ["--out", str(tmp_path / "p"), "--input-version-id", "v1", "--input-sha256", "b" * 64]
    assert main(argv) == 0
    assert verify(tmp_path / "p").manifest.input.version_id == "v1"


def test_stage_duplicate_ids_name_the_input_file_and_exit_2(tmp_path, capsys):
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "a"]}), table)
    argv = ["stage", str(table), "--id-field", "id", "--kind", "input"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DuplicateIds" in err
    assert f"{table}: 1 id(s) in 'id' appear more than once" in err and "e.g. 'a'" in err
    assert "staging" not in err
    assert list(tmp_path.iterdir()) == [table]  # nothing left behind


class _FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    with progress_bar("verify", stream=io.StringIO()) as bar:
        assert bar is None  # logs and pipes stay free of bar noise
    term = _FakeTerminal()
    with progress_bar("verify", stream=term, unit="B", scale=True) as bar:
        bar.bytes(4096, 8192)
        bar.bytes(8192, 8192)
        assert bar._bar.n == 8192 and bar._bar.total == 8192
    assert "verify" in term.getvalue()


def _stage_column(tmp_path, column: pa.Array) -> list[str]:
    """Stage ``id`` + column ``t``; return [exit code, stderr]."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [f"i{k}" for k in range(len(column))], "t": column}), table)
    argv = ["stage", str(table), "--id-field", "id", "--kind", "input"]
    return main([*argv, "--out", str(tmp_path / "o")])


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (pa.array([0, 1], pa.timestamp("ns", tz="UTC")), "column 't'.*would lose data: 1"),
        (pa.array([0, 1000], pa.timestamp("us")), "column 't'.*has no time zone"),
        (pa.array([1], pa.decimal128(5, 2)), "column 't'.*decimal128.*not in the v1 vocabulary"),
        (pa.array([[[1]]], pa.list_(pa.list_(pa.int64()))), "column 't'.*list of lists"),
    ],
)
def test_stage_a_type_it_cannot_store_names_the_column(tmp_path, capsys, column, message):
    assert _stage_column(tmp_path, column) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_stage_casts_timestamps_that_lose_nothing(tmp_path, capsys):
    ns = pa.array([0, 1000], pa.timestamp("ns", tz="Europe/Berlin"))
    assert _stage_column(tmp_path, ns) == 0
    m = verify(tmp_path / "o").manifest
    assert m.schema_.field("t").type == "timestamp[us,UTC]"
    t = pq.read_table(tmp_path / "o" / fmt.part_path(0)).column("t")
    assert t.cast(pa.int64()).to_pylist() == [0, 1]


# -- untrusted text, empty bundles, JSON always ------------------------------------------------


def test_inspect_an_empty_bundle(tmp_path, capsys):
    stage(input_table(0), tmp_path / "e", id_field="id", kind="input")
    assert main(["inspect", str(tmp_path / "e")]) == 0
    out = capsys.readouterr().out
    assert "items=0" in out and "(none)" in out


def test_crafted_names_cannot_forge_a_valid_line(bundle, capsys):
    (bundle / "x\nVALID elsewhere\n\x1b[2J\u202e").write_bytes(b"")
    assert main(["verify", str(bundle)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("INVALID")
    assert "x\\nVALID elsewhere\\n\\x1b[2J\\u202e" in lines[1]
    assert not any(line.startswith("VALID") for line in lines)


def test_crafted_manifest_text_is_escaped_by_inspect(tmp_path, capsys):
    with pytest.raises(SchemaMismatch, match=r"control character \(U\+000A\)"):
        stage(
            input_table(3).append_column("c\nVALID", pa.array([1, 2, 3])),
            tmp_path / "a",
            id_field="id",
            kind="input",
        )
    column = "c\u2028VALID elsewhere\u202e"  # a line separator and a bidi override: not C0
    table = input_table(3).append_column(column, pa.array([1, 2, 3]))
    stage(table, tmp_path / "b", id_field="id", kind="input")
    assert main(["inspect", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "c\\u2028VALID elsewhere\\u202e" in out
    assert "\u2028" not in out and not any(x.startswith("VALID") for x in out.splitlines())


def test_verify_json_on_a_missing_path_is_json(tmp_path, capsys):
    assert main(["verify", "--json", str(tmp_path / "nope")]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False and report["errors"][0]["type"] == "UsageError"


def test_json_output_is_ascii_whatever_the_bundle_holds(bundle, capsys):
    os.close(os.open(os.fsencode(bundle) + b"/\xff\xfe-\xc3\xa9", os.O_CREAT | os.O_WRONLY))
    assert main(["verify", "--json", str(bundle)]) == 1
    out = capsys.readouterr().out
    out.encode("ascii")
    assert json.loads(out)["errors"][0]["path"] == "\\xff\\xfe-\u00e9"


# -- stage: input formats and exit codes -------------------------------------------------------


def _schema_file(tmp_path, table: pa.Table) -> str:
    path = tmp_path / "schema.json"
    path.write_text(schema_file_text(Schema.from_arrow(table.schema)))
    return str(path)


def _write(table: pa.Table, path) -> None:
    import pyarrow.csv as pcsv
    import pyarrow.feather as feather

    suffix = path.suffix
    if suffix == ".feather":
        feather.write_feather(table, path)
    elif suffix == ".arrows":
        with pa.ipc.new_stream(path, table.schema) as w:
            w.write_table(table)
    elif suffix == ".csv":
        pcsv.write_csv(table, path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))


@pytest.mark.parametrize("name", ["t.feather", "t.arrows", "t.csv", "t.jsonl"])
def test_stage_reads_every_input_format(tmp_path, capsys, name):
    table = input_table(25).set_column(2, "y", pa.array([i / 4 for i in range(25)], pa.float64()))
    _write(table, tmp_path / name)
    argv = ["stage", str(tmp_path / name), "--id-field", "id", "--kind", "input"]
    argv += ["--out", str(tmp_path / "b"), "--rows-per-part", "10"]
    if name.endswith((".csv", ".jsonl")):
        argv += ["--schema", _schema_file(tmp_path, table)]
    assert main(argv) == 0, capsys.readouterr().err
    snap = verify(tmp_path / "b")
    got = pa.concat_tables(pq.read_table(p) for p in snap.part_paths())
    assert got.to_pylist() == table.to_pylist()
    assert [p.rows for p in snap.manifest.parts] == [10, 10, 5]


def test_stage_text_without_a_schema_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("id,x\na,1\n")
    argv = ["stage", str(tmp_path / "t.csv"), "--id-field", "id", "--kind", "input"]
    assert main([*argv, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "csv carries no types" in err and "--schema" in err and err.count("\n") == 1


def test_stage_a_value_not_of_its_declared_type_names_file_and_column(tmp_path, capsys):
    table = input_table(3)
    (tmp_path / "t.csv").write_text('id,x,y\n"a",1,0.5\n"b",two,0.5\n')
    argv = ["stage", str(tmp_path / "t.csv"), "--id-field", "id", "--kind", "input"]
    argv += ["--schema", _schema_file(tmp_path, table), "--out", str(tmp_path / "b")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "t.csv" in err and "'two'" in err and err.count("\n") == 1
    assert not (tmp_path / "b").exists()
