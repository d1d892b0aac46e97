"""Staging: random tables of every vocabulary type round-trip through a verified bundle."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from datetime import UTC
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bundle import format as fmt
from pipeline.bundle import leftovers
from pipeline.bundle.digest import file_bytes_hashed
from pipeline.bundle.errors import (
    BundleExists,
    CountMismatch,
    DigestMismatch,
    DuplicateIds,
    IdentifierError,
    SchemaMismatch,
    StatusMismatch,
)
from pipeline.bundle.manifest import JobInfo, Schema
from pipeline.bundle.stage import ReusedPart, stage
from pipeline.bundle.verify import verify
from tests.helpers.bundles import (
    INPUT_REF,
    INT_RANGES,
    input_table,
    make_input,
    make_result,
    result_table,
)

FLOAT_WIDTHS = {"float16": 16, "float32": 32, "float64": 64}


def scalar_values(name: str) -> st.SearchStrategy:
    """Python values of one scalar vocabulary type."""
    if name in INT_RANGES:
        lo, hi = INT_RANGES[name]
        return st.integers(lo, hi)
    if name in FLOAT_WIDTHS:
        # NaN is legal data but not equal to itself; the equality check below needs it out.
        return st.floats(width=FLOAT_WIDTHS[name], allow_nan=False)
    return {
        "string": st.text(max_size=12),
        "bool": st.booleans(),
        "binary": st.binary(max_size=12),
        "date32": st.dates(),
        "timestamp[us,UTC]": st.datetimes(timezones=st.just(UTC)),
    }[name]


SCALARS = list(fmt.SCALAR_TYPES)
ALL_TYPES = SCALARS + [f"list<{t}>" for t in SCALARS] + [f"fixed_size_list<{t},3>" for t in SCALARS]


def type_names() -> st.SearchStrategy[str]:
    """Any vocabulary type, list widths included."""
    return st.one_of(
        st.sampled_from(SCALARS),
        st.sampled_from(SCALARS).map(lambda t: f"list<{t}>"),
        st.tuples(st.sampled_from(SCALARS), st.integers(1, 4)).map(
            lambda tn: f"fixed_size_list<{tn[0]},{tn[1]}>"
        ),
    )


def column_values(type_name: str, nullable: bool, n: int) -> st.SearchStrategy[list]:
    """``n`` values of one column, with nulls only where the column is nullable."""
    dtype = fmt.to_arrow(type_name)
    if pa.types.is_fixed_size_list(dtype):
        elem = scalar_values(fmt.from_arrow(dtype.value_type))
        one = st.lists(elem | st.none(), min_size=dtype.list_size, max_size=dtype.list_size)
    elif pa.types.is_list(dtype):
        one = st.lists(scalar_values(fmt.from_arrow(dtype.value_type)) | st.none(), max_size=4)
    else:
        one = scalar_values(type_name)
    if nullable:
        one = one | st.none()
    return st.lists(one, min_size=n, max_size=n)


def to_array(values: list, type_name: str) -> pa.Array:
    """Build the Arrow array; float16 goes through numpy (Arrow has no Python half floats)."""
    dtype = fmt.to_arrow(type_name)
    if type_name == "float16":
        mask = np.array([v is None for v in values], dtype=bool)
        data = np.array([0.0 if v is None else v for v in values], dtype=np.float16)
        return pa.array(data, type=dtype, mask=mask)
    if pa.types.is_list(dtype) or pa.types.is_fixed_size_list(dtype):
        if fmt.from_arrow(dtype.value_type) == "float16":
            flat = [x for v in values if v is not None for x in v]
            inner = to_array(flat, "float16")
            offsets, pos = [], 0
            for v in values:
                offsets.append(pos)
                pos += 0 if v is None else len(v)
            offsets.append(pos)
            mask = pa.array([v is None for v in values], pa.bool_())
            if pa.types.is_list(dtype):
                return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner, mask=mask)
            full = to_array([x for v in values for x in (v or [None] * dtype.list_size)], "float16")
            return pa.FixedSizeListArray.from_arrays(full, dtype.list_size, mask=mask)
    return pa.array(values, type=dtype)


@st.composite
def tables(draw) -> pa.Table:
    """A table with a unique string id column and 1-6 columns of random vocabulary types."""
    n = draw(st.integers(0, 40))
    ids = draw(st.lists(st.text(min_size=1, max_size=10), min_size=n, max_size=n, unique=True))
    fields = [pa.field("item_id", pa.string(), nullable=False)]
    arrays = [pa.array(ids, pa.string())]
    for i, type_name in enumerate(draw(st.lists(type_names(), min_size=1, max_size=6))):
        nullable = draw(st.booleans())
        values = draw(column_values(type_name, nullable, n))
        fields.append(pa.field(f"c{i}", fmt.to_arrow(type_name), nullable=nullable))
        arrays.append(to_array(values, type_name))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


@st.composite
def tables_of_every_type(draw) -> pa.Table:
    """One column of each vocabulary type (lists included), nullable ones holding some nulls."""
    n = draw(st.integers(1, 6))  # 48 columns: keep each small or Hypothesis runs out of data
    ids = draw(st.lists(st.text(min_size=1, max_size=8), min_size=n, max_size=n, unique=True))
    fields = [pa.field("item_id", pa.string(), nullable=False)]
    arrays = [pa.array(ids, pa.string())]
    for i, type_name in enumerate(ALL_TYPES):
        nullable = i % 2 == 0
        values = draw(column_values(type_name, nullable, n))
        if nullable:
            values[0] = None  # every nullable column really holds a null
        fields.append(pa.field(f"c{i}", fmt.to_arrow(type_name), nullable=nullable))
        arrays.append(to_array(values, type_name))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


HYPOTHESIS = settings(
    max_examples=min(60, settings().max_examples), suppress_health_check=[HealthCheck.too_slow]
)


@HYPOTHESIS
@given(table=tables(), rows_per_part=st.integers(1, 16))
def test_random_tables_stage_and_verify(table, rows_per_part):
    with tempfile.TemporaryDirectory() as d:
        snap = stage(
            table, Path(d) / "b", id_field="item_id", kind="input", rows_per_part=rows_per_part
        )
        again = verify(Path(d) / "b")
        m = again.manifest
        assert again.identity == snap.identity
        # The declared schema is the table's, and it maps back to the same Arrow schema.
        assert m.schema_ == Schema.from_arrow(table.schema)
        assert m.schema_.to_arrow() == table.schema
        assert m.counts.items == table.num_rows
        assert [p.rows for p in m.parts] == _split(table.num_rows, rows_per_part)
        # Every value comes back, in order, with its exact type.
        read = [pq.read_table(p) for p in again.part_paths()]
        back = pa.concat_tables(read) if read else table.schema.empty_table()
        assert back.schema == table.schema
        assert back.equals(table)


@settings(
    max_examples=min(20, settings().max_examples),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(table=tables_of_every_type(), rows_per_part=st.integers(1, 5))
def test_every_vocabulary_type_round_trips(table, rows_per_part):
    with tempfile.TemporaryDirectory() as d:
        snap = stage(
            table, Path(d) / "b", id_field="item_id", kind="input", rows_per_part=rows_per_part
        )
        m = verify(Path(d) / "b").manifest
        assert [f.type for f in m.schema_.fields[1:]] == ALL_TYPES
        assert m.schema_.to_arrow() == table.schema
        back = pa.concat_tables(pq.read_table(p) for p in snap.part_paths())
        assert back.equals(table)


@settings(max_examples=min(15, settings().max_examples))
@given(table=tables())
def test_same_content_same_digest_new_version(table):
    with tempfile.TemporaryDirectory() as d:
        a = stage(table, Path(d) / "a", id_field="item_id", kind="input", rows_per_part=7)
        b = stage(table, Path(d) / "b", id_field="item_id", kind="input", rows_per_part=7)
        assert a.identity.content_sha256 == b.identity.content_sha256
        assert a.identity.version_id != b.identity.version_id


def _split(n: int, k: int) -> list[int]:
    return [k] * (n // k) + ([n % k] if n % k else [])


def test_streamed_batches_equal_the_table(tmp_path):
    t = input_table(100)
    whole = stage(t, tmp_path / "a", id_field="id", kind="input", rows_per_part=30)
    streamed = stage(
        iter(t.to_batches(max_chunksize=7)),
        tmp_path / "b",
        id_field="id",
        kind="input",
        schema=t.schema,
        rows_per_part=30,
    )
    assert streamed.identity.content_sha256 == whole.identity.content_sha256


def test_stream_needs_a_schema(tmp_path):
    with pytest.raises(ValueError, match="needs schema="):
        stage(iter(input_table(3).to_batches()), tmp_path / "b", id_field="id", kind="input")


def test_dictionary_strings_are_declared_string(tmp_path):
    t = input_table(10)
    t = t.append_column("tag", pa.array(["a", "b"] * 5).dictionary_encode())
    snap = stage(t, tmp_path / "b", id_field="id", kind="input")
    assert snap.manifest.schema_.field("tag").type == "string"
    assert pq.read_schema(snap.part_paths()[0]).field("tag").type == pa.string()


def test_existing_dest_is_refused_and_untouched(tmp_path):
    first = make_input(tmp_path / "b")
    before = {p: p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    with pytest.raises(BundleExists, match="never overwritten"):
        make_input(tmp_path / "b", n=5)
    after = {p: p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    assert after == before
    assert verify(tmp_path / "b").identity == first.identity
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("existing", ["empty-dir", "file", "dangling-link"])
def test_any_existing_name_is_refused(tmp_path, existing):
    dest = tmp_path / "b"
    if existing == "empty-dir":
        dest.mkdir()
    elif existing == "file":
        dest.write_text("x")
    else:
        os.symlink(tmp_path / "nowhere", dest)
    with pytest.raises(BundleExists):
        make_input(dest)
    assert os.path.lexists(dest) and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("name", ["b" * 250, "b" * 255, "\u00e9" * 127])
def test_any_name_the_filesystem_takes_stages(tmp_path, name):
    make_input(tmp_path / name)
    assert verify(tmp_path / name).manifest.counts.items == 30
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no work in progress left


def test_failed_staging_leaves_nothing(tmp_path):
    t = input_table(10)
    ids = t.column("id").to_pylist()
    ids[7] = ids[2]
    t = t.set_column(0, "id", pa.array(ids))
    with pytest.raises(IdentifierError, match="appear more than once"):
        stage(t, tmp_path / "b", id_field="id", kind="input", rows_per_part=4)
    assert list(tmp_path.iterdir()) == []


def test_null_and_non_string_ids_are_refused(tmp_path):
    t = pa.table({"id": ["a", None, "c"]})
    with pytest.raises(IdentifierError, match="holds 1 null"):
        stage(t, tmp_path / "a", id_field="id", kind="input")
    with pytest.raises(IdentifierError, match="must be a string column"):
        stage(pa.table({"id": [1, 2]}), tmp_path / "b", id_field="id", kind="input")
    assert list(tmp_path.iterdir()) == []


def test_result_counts_and_partial(tmp_path):
    snap = make_result(tmp_path / "r", n=30, outstanding=["late-1", "late-2"])
    m = snap.manifest
    assert (m.counts.accepted, m.counts.failed, m.counts.abstained) == (10, 10, 10)
    assert m.counts.outstanding == 2 and m.outstanding.rows == 2
    assert m.job.status == "PARTIAL" and m.job.next_action.items == 2
    assert m.input == INPUT_REF


@pytest.mark.parametrize(
    ("last_status", "job_status", "error", "match"),
    [
        ("unsure", "SUCCEEDED", CountMismatch, "'unsure'"),  # a status outside the vocabulary
        (None, "PARTIAL", StatusMismatch, None),  # PARTIAL, but nothing is outstanding
    ],
)
def test_a_result_with_a_bad_status_is_refused(tmp_path, last_status, job_status, error, match):
    t = result_table(6)
    if last_status is not None:
        t = t.set_column(2, fmt.STATUS_COLUMN, pa.array(["accepted"] * 5 + [last_status]))
    with pytest.raises(error, match=match):
        stage(
            t,
            tmp_path / "r",
            id_field="id",
            kind="result",
            job=JobInfo(job_id="j", status=job_status, attempt=1),
            input=INPUT_REF,
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kind", "kw", "match"),
    [
        ("result", {"input": INPUT_REF}, "must describe its job"),
        ("prediction", {}, "must name its input"),
        ("input", {"input": INPUT_REF}, "derives from nothing"),
        ("input", {"job": JobInfo(job_id="j", status="SUCCEEDED", attempt=1)}, "only for result"),
    ],
)
def test_lineage_is_checked_before_writing(tmp_path, kind, kw, match):
    with pytest.raises(ValueError, match=match):
        stage(input_table(3), tmp_path / "b", id_field="id", kind=kind, **kw)
    assert list(tmp_path.iterdir()) == []


def _stage_the_late_item(old, dest: Path, parts, **job: str):
    """item-00020 staged at ``dest`` as attempt 2 of job-1, binding ``parts`` of ``old`` as they
    are (what a resubmission publishes)."""
    return stage(
        result_table(21).slice(20),
        dest,
        id_field="id",
        kind="result",
        job=JobInfo(job_id="job-1", status="SUCCEEDED", attempt=2, **job),
        input=INPUT_REF,
        reuse_parts=[ReusedPart(old.root, e) for e in parts],
    )


def test_reused_parts_are_linked_not_rewritten(tmp_path):
    old = make_result(tmp_path / "v1", n=20, rows_per_part=10, outstanding=["late-1"])
    new = _stage_the_late_item(old, tmp_path / "v2", old.manifest.parts, parent_version_id="x")
    assert [p.sha256 for p in new.manifest.parts[:2]] == [p.sha256 for p in old.manifest.parts]
    assert os.path.samefile(old.part_paths()[0], new.part_paths()[0])
    assert new.manifest.counts.items == 21
    assert sum(new.manifest.counts.by_status.values()) == 21


def test_progress_callback_counts_rows(tmp_path):
    seen = []
    stage(
        input_table(50),
        tmp_path / "b",
        id_field="id",
        kind="input",
        rows_per_part=20,
        on_rows=seen.append,
    )
    assert sum(seen) == 50


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".staging-" in p.name]


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum not installed")
def test_content_sha256_is_what_coreutils_prints(tmp_path):
    snap = make_result(tmp_path / "r", n=25, rows_per_part=10, outstanding=["late-1"])
    files = [f.path for f in snap.manifest.bound_files]
    assert files[-1] == fmt.OUTSTANDING_NAME
    listing = subprocess.run(
        ["sha256sum", *files], cwd=snap.root, capture_output=True, check=True
    ).stdout
    digest = subprocess.run(["sha256sum"], input=listing, capture_output=True, check=True)
    assert digest.stdout.split()[0].decode() == snap.identity.content_sha256


def test_empty_table_is_a_bundle_with_no_parts(tmp_path):
    snap = stage(input_table(0), tmp_path / "b", id_field="id", kind="input")
    assert snap.manifest.parts == [] and snap.manifest.counts.items == 0
    assert snap.identity.content_sha256 == hashlib.sha256(b"").hexdigest()


def test_staging_hashes_each_written_file_once(tmp_path):
    before = file_bytes_hashed()
    snap = make_result(tmp_path / "r", n=30, rows_per_part=10, outstanding=["late-1"])
    assert file_bytes_hashed() - before == snap.stats.bytes_total  # written, hashed, verified
    assert snap.stats.bytes_hashed == 0  # the verification trusted the fresh digests...
    assert verify(snap.root).stats.bytes_hashed == snap.stats.bytes_total  # ...which hold


def test_a_reused_part_is_hashed_and_a_corrupt_one_refused(tmp_path):
    old = make_result(tmp_path / "v1", n=20, rows_per_part=10)
    entry = old.manifest.parts[0]
    bad = entry.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(DigestMismatch, match="part-00000"):
        _stage_the_late_item(old, tmp_path / "v2", [bad])
    assert not (tmp_path / "v2").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]  # nothing half-written left behind


# -- hardening: read-only files, one version-id rule, refusals before writing, no leftovers ------


def _modes(root: Path) -> set[int]:
    return {stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*") if p.is_file()}


def test_every_staged_file_is_read_only_and_shared_links_stay_so(tmp_path):
    old = make_result(tmp_path / "v1", n=20, rows_per_part=10, outstanding=["late-1"])
    assert _modes(old.root) == {0o444}
    new = _stage_the_late_item(old, tmp_path / "v2", old.manifest.parts)
    assert _modes(new.root) == {0o444}
    shared = new.part_paths()[0]
    assert os.path.samefile(shared, old.part_paths()[0]) and shared.stat().st_nlink == 2


@pytest.mark.parametrize(
    "version_id", ["", "../../etc/x", "a/b", ".hidden", "-x", "x" * 201, "v\nVALID", "caf\u00e9"]
)
def test_a_bad_version_id_is_refused_before_writing_by_the_shared_rule(tmp_path, version_id):
    with pytest.raises(ValueError, match="not a valid version id") as info:
        stage(input_table(3), tmp_path / "b", id_field="id", kind="input", version_id=version_id)
    with pytest.raises(ValueError) as rule:
        fmt.check_version_id(version_id)
    assert str(info.value) == str(rule.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("version_id", ["v1", "job-1-a001-0f3c9a2e", "x" * 200, "A.b_c-9"])
def test_a_good_version_id_is_kept(tmp_path, version_id):
    snap = stage(input_table(3), tmp_path / "b", id_field="id", kind="input", version_id=version_id)
    assert snap.identity.version_id == version_id


def test_a_result_table_without_the_lithi_columns_names_them(tmp_path):
    with pytest.raises(SchemaMismatch, match="missing lithi_status, lithi_confidence, lithi_veri"):
        stage(
            input_table(3),
            tmp_path / "r",
            id_field="id",
            kind="result",
            job=JobInfo(job_id="j", status="SUCCEEDED", attempt=1),
            input=INPUT_REF,
            source="t.parquet",
        )
    assert list(tmp_path.iterdir()) == []


def test_a_valid_column_beside_its_nullable_base_is_refused_naming_both(tmp_path):
    t = input_table(3).append_column("y__valid", pa.array([True, False, True]))
    with pytest.raises(SchemaMismatch, match="'y__valid'.*nullable column 'y'"):
        stage(t, tmp_path / "b", id_field="id", kind="input")
    assert list(tmp_path.iterdir()) == []


def test_duplicate_ids_are_named_in_the_source_not_the_staging_directory(tmp_path):
    t = input_table(6).set_column(0, "id", pa.array(["a", "b", "c", "d", "e", "a"]))
    with pytest.raises(DuplicateIds) as info:
        stage(t, tmp_path / "b", id_field="id", kind="input", rows_per_part=4, source="in.csv")
    assert str(info.value) == (
        "in.csv: 1 id(s) in 'id' appear more than once (expected each exactly once), e.g. 'a'"
    )


@pytest.mark.parametrize("errno_", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_an_io_failure_leaves_nothing_behind_not_even_new_parents(tmp_path, monkeypatch, errno_):
    real = pq.ParquetWriter.write_table
    calls = []

    def failing(self, table, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first part is written; the second hits the failure
            raise OSError(errno_, os.strerror(errno_))
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    dest = tmp_path / "new" / "deeper" / "b"
    with pytest.raises(OSError) as info:
        stage(input_table(30), dest, id_field="id", kind="input", rows_per_part=10)
    assert info.value.errno == errno_
    assert list(tmp_path.iterdir()) == []


def test_only_parents_it_created_are_removed(tmp_path):
    (tmp_path / "mine").mkdir()
    t = input_table(3).set_column(0, "id", pa.array(["a", "a", "b"]))
    with pytest.raises(DuplicateIds):
        stage(t, tmp_path / "mine" / "x" / "b", id_field="id", kind="input")
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]
    assert list((tmp_path / "mine").iterdir()) == []


@pytest.mark.parametrize(
    ("column", "declared"),
    [
        (pa.array(["a", None], pa.large_string()), "string"),
        (pa.array([b"a", None], pa.large_binary()), "binary"),
        (pa.array([[1], None], pa.large_list(pa.int64())), "list<int64>"),
        (pa.array(["a", "b"]).dictionary_encode(), "string"),
        (pa.array([1_000, None], pa.timestamp("ns", tz="UTC")), "timestamp[us,UTC]"),
        (pa.array([1, None], pa.timestamp("s", tz="Asia/Tokyo")), "timestamp[us,UTC]"),
    ],
)
def test_source_types_become_their_v1_type(tmp_path, column, declared):
    t = pa.table({"id": ["a", "b"], "c": column})
    snap = stage(t, tmp_path / "b", id_field="id", kind="input")
    assert snap.manifest.schema_.field("c").type == declared
    got = pq.read_table(snap.part_paths()[0]).column("c")
    assert got.to_pylist() == column.cast(fmt.to_arrow(declared)).to_pylist()


def _exited_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    return int(child.stdout)


def test_the_next_staging_sweeps_what_exited_stagings_left_and_nothing_else(tmp_path):
    host = leftovers.owner().split("-")[1]
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        names = {
            "dead": f".b.staging-{_exited_pid()}-{host}-0123456789ab",
            "live": f".b.staging-{alive.pid}-{host}-0123456789ab",
            "other host": f".b.staging-{_exited_pid()}-00000000-0123456789ab",
            "no owner": ".b.staging-0123456789ab",  # named before owners were
            "a bundle": "b-old",
        }
        for name in names.values():
            (tmp_path / name / "parts").mkdir(parents=True)
        (tmp_path / names["dead"] / "parts" / "part-00000.parquet").write_bytes(b"x")
        os.chmod(tmp_path / names["dead"] / "parts", 0o555)  # as a killed staging leaves it
        make_input(tmp_path / "b")
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {"b", *names.values()} - {names["dead"]}
    finally:
        alive.kill()
        alive.wait()
