"""Every single corruption is caught, by the right error class, and only by it."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bundle import errors as err
from pipeline.bundle import format as fmt
from pipeline.bundle.verify import MAX_LISTED, check, verify
from tests.helpers.bundles import (
    error_types,
    footer_says,
    load_manifest,
    make_input,
    make_result,
    nest,
    rebind,
    rewrite_part,
    save_manifest,
    unnest,
    write_bytes,
)

P0, P1 = fmt.part_path(0), fmt.part_path(1)


@pytest.fixture
def bundle(tmp_path):
    make_input(tmp_path / "b", n=30, rows_per_part=10)
    return tmp_path / "b"


def assert_only(bundle, cls, *, match: str | None = None):
    """``check`` reports exactly one violation of ``cls``, and ``verify`` raises it."""
    assert error_types(bundle) == [cls]
    with pytest.raises(cls, match=match):
        verify(bundle)


def test_pristine_bundle_has_no_violations(bundle):
    result = check(bundle)
    assert result.ok and result.errors == []
    stats = result.stats
    assert stats.files_hashed == 3 and stats.bytes_hashed == stats.bytes_total > 0
    assert verify(bundle).identity == result.manifest.snapshot == result.verified().identity
    result.raise_first()  # nothing to raise


def test_a_check_result_raises_its_first_violation(bundle):
    (bundle / "stray.txt").write_text("x")
    result = check(bundle)
    assert not result.ok and result.manifest is not None
    with pytest.raises(err.UnboundFile, match="stray.txt"):
        result.verified()
    (bundle / fmt.MANIFEST_NAME).unlink()
    missing = check(bundle)
    assert missing.manifest is None and missing.stats is None
    with pytest.raises(err.IncompleteBundle):
        missing.raise_first()


def test_flipped_byte_in_a_part(bundle):
    p = bundle / P1
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    assert_only(bundle, err.DigestMismatch, match=r"part-00001\.parquet: sha256 expected")


def test_truncated_part(bundle):
    p = bundle / P0
    os.truncate(p, p.stat().st_size - 1)
    assert_only(bundle, err.SizeMismatch, match=r"part-00000\.parquet: expected \d+ bytes, found")


def test_wrong_row_count(bundle):
    m = load_manifest(bundle)
    m["parts"][0]["rows"] += 1
    m["counts"]["items"] += 1  # keep the manifest self-consistent: the file is what disagrees
    save_manifest(bundle, m)
    assert_only(bundle, err.RowCountMismatch, match="manifest says 11 rows, Parquet holds 10")


def test_missing_part(bundle):
    (bundle / P1).unlink()
    assert_only(
        bundle, err.MissingFile, match="part-00001.parquet: bound by the manifest but missing"
    )


@pytest.mark.parametrize("rel", ["stray.txt", "parts/part-00003.parquet", ".hidden"])
def test_extra_file(bundle, rel):
    (bundle / rel).write_bytes(b"not bound")
    assert_only(bundle, err.UnboundFile, match="not bound by the manifest")


def test_extra_directory(bundle):
    (bundle / "cache").mkdir()
    assert_only(bundle, err.UnboundFile, match="directory not bound")


def test_symlinked_part(bundle, tmp_path):
    # The link points at identical bytes, so only the symlink rule can reject it.
    outside = tmp_path / "outside.parquet"
    os.replace(bundle / P0, outside)
    os.symlink(outside, bundle / P0)
    assert_only(bundle, err.UnsafePath, match="is a symlink")


def test_symlinked_parts_directory(bundle, tmp_path):
    os.replace(bundle / "parts", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", bundle / "parts")
    assert err.UnsafePath in error_types(bundle)
    with pytest.raises(err.UnsafePath):
        verify(bundle)


def test_renamed_column(bundle):
    t = pq.read_table(bundle / P1).rename_columns(["id", "x_renamed", "y"])
    rewrite_part(bundle, P1, t)
    assert_only(
        bundle, err.SchemaMismatch, match=r"columns expected \['id', 'x', 'y'\], found \['id', 'x_"
    )


def test_reordered_columns(bundle):
    t = pq.read_table(bundle / P1).select(["id", "y", "x"])
    rewrite_part(bundle, P1, t)
    assert_only(bundle, err.SchemaMismatch, match="columns expected")


def test_changed_type(bundle):
    t = pq.read_table(bundle / P0)
    t = t.set_column(1, pa.field("x", pa.int32()), t.column("x").cast(pa.int32()))
    rewrite_part(bundle, P0, t)
    assert_only(bundle, err.SchemaMismatch, match="column 'x': type expected int64, found int32")


def test_changed_nullability(bundle):
    t = pq.read_table(bundle / P0)
    t = t.cast(pa.schema([t.schema.field(0), t.schema.field(1).with_nullable(False), t.schema[2]]))
    rewrite_part(bundle, P0, t)
    assert_only(bundle, err.SchemaMismatch, match="column 'x': nullable expected True, found False")


def test_dictionary_encoded_strings_count_as_strings(bundle):
    t = pq.read_table(bundle / P0)
    t = t.set_column(0, "id", t.column("id").dictionary_encode())
    t = t.cast(pa.schema([t.schema.field(0).with_nullable(False), t.schema[1], t.schema[2]]))
    rewrite_part(bundle, P0, t)
    assert pa.types.is_dictionary(pq.read_schema(bundle / P0).field("id").type)
    assert error_types(bundle) == []


def test_null_id(bundle):
    # Parquet cannot hold a null in a required column, so a null id means a nullable id column.
    t = pq.read_table(bundle / P1)
    ids = t.column("id").to_pylist()
    ids[3] = None
    t = t.set_column(0, pa.field("id", pa.string(), nullable=True), pa.array(ids, pa.string()))
    rewrite_part(bundle, P1, t)
    errors = check(bundle).errors
    # The null is reported first, as what it is; the nullable declaration is also a mismatch.
    assert [type(e) for e in errors] == [err.IdentifierError, err.SchemaMismatch]
    with pytest.raises(err.IdentifierError, match=r"part-00001\.parquet: 1 null value\(s\) in id"):
        verify(bundle)


def test_duplicate_id_across_parts(bundle):
    t = pq.read_table(bundle / P1)
    ids = t.column("id").to_pylist()
    ids[4] = "item-00002"  # lives in part 0
    t = t.set_column(0, t.schema.field(0), pa.array(ids, pa.string()))
    rewrite_part(bundle, P1, t)
    assert_only(bundle, err.DuplicateIds, match=r"1 id\(s\) in 'id' appear more than once")
    msg = str(check(bundle).errors[0])
    assert "'item-00002'" in msg and P0 in msg and P1 in msg


def test_duplicate_id_between_parts_and_outstanding(tmp_path):
    b = tmp_path / "r"
    make_result(b, n=9, rows_per_part=5, outstanding=["late-1"])
    t = pa.table({"id": pa.array(["item-00003"], pa.string())})  # item-00003 is in part 0
    rewrite_part(b, fmt.OUTSTANDING_NAME, t.cast(pa.schema([pa.field("id", pa.string(), False)])))
    assert_only(b, err.DuplicateIds, match="appear more than once")
    assert "outstanding.parquet" in str(check(b).errors[0])


def test_count_mismatch_items(bundle):
    m = load_manifest(bundle)
    m["counts"]["items"] = 31
    save_manifest(bundle, m)
    assert_only(bundle, err.CountMismatch, match="counts.items is 31 but the parts hold 30 rows")


def test_count_mismatch_by_status(tmp_path):
    b = tmp_path / "r"
    make_result(b, n=30)
    m = load_manifest(b)
    m["counts"]["accepted"] += 1
    m["counts"]["failed"] -= 1  # still sums to items: only the parts can disagree
    save_manifest(b, m)
    assert_only(b, err.CountMismatch, match="counts by status expected")


def test_unknown_status_value(tmp_path):
    b = tmp_path / "r"
    make_result(b, n=30)
    t = pq.read_table(b / P0)
    statuses = t.column(fmt.STATUS_COLUMN).to_pylist()
    statuses[0] = "maybe"
    i = t.schema.get_field_index(fmt.STATUS_COLUMN)
    t = t.set_column(i, t.schema.field(i), pa.array(statuses))
    rewrite_part(b, P0, t)
    assert_only(b, err.CountMismatch, match="lithi_status holds 'maybe'")


def test_partial_without_outstanding(tmp_path):
    b = tmp_path / "r"
    make_result(b, n=30)
    m = load_manifest(b)
    m["job"]["status"] = "PARTIAL"
    save_manifest(b, m)
    assert_only(b, err.StatusMismatch, match="PARTIAL exactly when it has outstanding items")


def test_outstanding_without_partial(tmp_path):
    b = tmp_path / "r"
    make_result(b, n=30, outstanding=["late-1", "late-2"])
    assert verify(b).manifest.is_partial
    m = load_manifest(b)
    m["job"]["status"] = "SUCCEEDED"
    m["job"]["next_action"] = None
    save_manifest(b, m)
    assert_only(b, err.StatusMismatch)


def test_missing_manifest(bundle):
    (bundle / fmt.MANIFEST_NAME).unlink()
    with pytest.raises(err.IncompleteBundle, match="part files alone never mean the job finished"):
        verify(bundle)
    assert error_types(bundle) == [err.IncompleteBundle]


def test_not_a_directory(tmp_path):
    with pytest.raises(err.IncompleteBundle, match="not a bundle directory"):
        verify(tmp_path / "nothing-here")


def test_manifest_not_json(bundle):
    write_bytes(bundle / fmt.MANIFEST_NAME, b'{"manifest_version": 1, ')
    assert_only(bundle, err.ManifestInvalid, match="is not JSON")


def test_manifest_symlink(bundle, tmp_path):
    os.replace(bundle / fmt.MANIFEST_NAME, tmp_path / "m.json")
    os.symlink(tmp_path / "m.json", bundle / fmt.MANIFEST_NAME)
    assert_only(bundle, err.UnsafePath, match="manifest must be a regular file")


def test_wrong_content_sha256(bundle):
    m = load_manifest(bundle)
    m["snapshot"]["content_sha256"] = "0" * 64
    save_manifest(bundle, m)
    assert_only(bundle, err.DigestMismatch, match="content_sha256 expected 0000")


@pytest.mark.parametrize(
    "bad", ["/etc/passwd", "../outside.parquet", "parts/../../x.parquet", "parts\\part.parquet"]
)
def test_unsafe_paths_in_manifest_are_rejected(bundle, bad):
    m = load_manifest(bundle)
    m["parts"][0]["path"] = bad
    save_manifest(bundle, m)
    assert_only(bundle, err.UnsafePath, match="normalised relative path inside the bundle")


def test_every_violation_is_listed_while_verify_raises_the_first(bundle):
    (bundle / "stray").write_bytes(b"x")
    (bundle / P1).unlink()
    t = pq.read_table(bundle / P0).rename_columns(["id", "xx", "y"])
    pq.write_table(t, bundle / P0)  # digest now wrong too: schema is not read from bad bytes
    types = error_types(bundle)
    assert types[0] is err.UnboundFile
    assert err.MissingFile in types
    assert err.DigestMismatch in types or err.SizeMismatch in types
    assert err.SchemaMismatch not in types
    with pytest.raises(err.UnboundFile):
        verify(bundle)


def test_schema_of_intact_parts_still_checked_beside_other_errors(bundle):
    t = pq.read_table(bundle / P0).rename_columns(["id", "xx", "y"])
    rewrite_part(bundle, P0, t)
    (bundle / "stray").write_bytes(b"x")
    assert error_types(bundle) == [err.UnboundFile, err.SchemaMismatch]


def test_trusted_files_are_not_hashed(bundle):
    snap = verify(bundle, trusted=lambda path, entry: entry.path == P0)
    assert snap.stats.files_hashed == 2
    assert snap.stats.bytes_hashed == snap.stats.bytes_total - (bundle / P0).stat().st_size


def test_progress_reaches_the_total(bundle):
    seen = []
    verify(bundle, progress=lambda done, total: seen.append((done, total)))
    total = sum(p.stat().st_size for p in (bundle / "parts").iterdir())
    assert seen and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_rebind_alone_keeps_a_bundle_valid(bundle):
    # Guards the helper every content corruption relies on: rebinding is not itself a violation.
    rebind(bundle)
    assert error_types(bundle) == []


def test_errors_are_one_family():
    for cls in (
        err.IncompleteBundle,
        err.DigestMismatch,
        err.SchemaMismatch,
        err.UnboundFile,
        err.UnsafePath,
    ):
        assert issubclass(cls, err.BundleError)


def test_unreadable_parquet_with_matching_digest_is_reported_not_raised(bundle):
    p = bundle / P0
    data = bytearray(p.read_bytes())
    data[8:200] = b"\xff" * 192  # wreck the first data pages, keep the footer
    write_bytes(p, bytes(data))
    rebind(bundle)
    types = error_types(bundle)
    assert types and all(issubclass(t, err.BundleError) for t in types)
    with pytest.raises(err.BundleError):
        verify(bundle)


def test_footer_row_count_must_match_its_row_groups(tmp_path):
    b = tmp_path / "b"
    make_input(b, n=8, rows_per_part=4)
    footer_says(b / P0, 3)  # the row group still holds 4 rows, and pyarrow reads 4
    m = rebind(b)
    m["parts"][0]["rows"] = 3
    m["counts"]["items"] = 7
    save_manifest(b, m)
    assert pq.read_table(b / P0).num_rows == 4
    assert_only(b, err.RowCountMismatch, match="footer says 3 rows, its row groups hold 4")


def test_deeply_nested_unbound_directories_are_one_violation(bundle):
    nest(bundle / "deep", 1200)  # os.walk recursed once a level: a RecursionError
    try:
        errors = check(bundle).errors
    finally:
        unnest(bundle / "deep")  # shutil.rmtree recurses too
    assert [type(e) for e in errors] == [err.UnboundFile]
    assert errors[0].path == "deep"


def test_parts_as_a_file_is_reported_not_raised(bundle):
    for p in (bundle / "parts").iterdir():
        p.unlink()
    (bundle / "parts").rmdir()
    (bundle / "parts").write_bytes(b"x")
    assert error_types(bundle) == [
        err.UnboundFile,
        err.MissingFile,
        err.MissingFile,
        err.MissingFile,
    ]


def test_a_bound_directory_where_a_part_should_be(bundle):
    (bundle / P0).unlink()
    (bundle / P0).mkdir()
    types = error_types(bundle)
    assert types == [err.UnboundFile, err.UnsafePath]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_manifest_that_is_not_a_regular_file(bundle, kind):
    (bundle / fmt.MANIFEST_NAME).unlink()
    if kind == "directory":
        (bundle / fmt.MANIFEST_NAME).mkdir()
    else:
        os.mkfifo(bundle / fmt.MANIFEST_NAME)  # opened without blocking, then refused
    errors = check(bundle).errors
    assert [type(e) for e in errors] == [err.UnsafePath]
    assert "must be a regular file" in str(errors[0])


def test_a_huge_manifest_is_refused_by_its_size(bundle):
    with open(bundle / fmt.MANIFEST_NAME, "r+b") as f:
        f.truncate(fmt.MAX_MANIFEST_BYTES + 1)  # sparse: costs no disk
    assert_only(bundle, err.ManifestInvalid, match=f"expected at most {fmt.MAX_MANIFEST_BYTES}")


def test_many_unbound_files_are_listed_up_to_a_bound(bundle):
    for i in range(MAX_LISTED + 5):
        (bundle / f"stray-{i:05d}").write_bytes(b"")
    errors = check(bundle).errors
    assert len(errors) == MAX_LISTED + 1
    assert "5 more unbound entries" in str(errors[-1])


def test_a_non_utf8_file_name_is_named_with_escapes(bundle):
    os.close(os.open(os.fsencode(bundle) + b"/stray-\xff", os.O_CREAT | os.O_WRONLY))
    errors = check(bundle).errors
    assert [type(e) for e in errors] == [err.UnboundFile]
    assert errors[0].path == "stray-\\xff"
    str(errors[0]).encode("utf-8")  # printable anywhere: no surrogate left in the message


def test_an_unreadable_part_is_a_violation(bundle, monkeypatch):
    import pipeline.bundle.digest as digest

    real = digest.sha256_file

    def failing(path, on_bytes=None):
        if str(path).endswith(P1):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, on_bytes)

    monkeypatch.setattr(digest, "sha256_file", failing)
    errors = check(bundle).errors
    assert [type(e) for e in errors] == [err.UnreadableFile]
    assert P1 in str(errors[0]) and "Permission denied" in str(errors[0])
