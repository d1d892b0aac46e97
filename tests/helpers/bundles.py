"""Small bundles for tests: contract bundles to corrupt precisely, and reader bundles of any shape.

Contract bundles (:func:`make_input`, :func:`make_result`) are corrupted one rule at a time, so
each test trips exactly one check. Reader bundles (:func:`make_bundle`) have uneven part sizes,
string ids with leading zeros, a vector feature and every ``lithi_*`` column.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.bundle import format as fmt
from pipeline.bundle.digest import content_sha256, sha256_file
from pipeline.bundle.manifest import InputRef, JobInfo, Schema
from pipeline.bundle.stage import ReusedPart, stage
from pipeline.bundle.verify import VerifiedSnapshot, check, verify

#: Each integer vocabulary type's whole range, ends included: what staging must keep exactly.
INT_RANGES = {
    name: (int(np.iinfo(name).min), int(np.iinfo(name).max))
    for name in fmt.NUMERIC_TYPES
    if pa.types.is_integer(fmt.to_arrow(name))
}
#: The input snapshot every test result bundle names (it need not exist: only its identity counts).
INPUT_REF = InputRef(version_id="input-v1", content_sha256="a" * 64)
JOB = JobInfo(job_id="job-1", status="SUCCEEDED", attempt=1)


@contextlib.contextmanager
def row_groups_of(rows: int) -> Iterator[None]:
    """Stage with row groups of ``rows`` rows: the part writer's size and the chunks ``stage``
    cuts a table into (the staging default is far larger than any test bundle)."""
    with pytest.MonkeyPatch.context() as mp:
        for module in ("pipeline.bundle.stage", "pipeline.bundle.writer"):
            mp.setattr(importlib.import_module(module), "ROW_GROUP_ROWS", rows)
        yield


def input_table(n: int = 30, start: int = 0) -> pa.Table:
    """A small input table: string ids, an int and a float column."""
    ids = [f"item-{i:05d}" for i in range(start, start + n)]
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "x": pa.array(range(start, start + n), pa.int64()),
            "y": pa.array([i / 7 for i in range(n)], pa.float32()),
        }
    )


def result_table(n: int = 30) -> pa.Table:
    """A result table: statuses cycle accepted, failed, abstained; confidence null where failed."""
    statuses = [fmt.STATUSES[i % 3] for i in range(n)]
    return pa.table(
        {
            "id": pa.array([f"item-{i:05d}" for i in range(n)], pa.string()),
            "x": pa.array(range(n), pa.int64()),
            fmt.STATUS_COLUMN: statuses,
            fmt.CONFIDENCE_COLUMN: pa.array(
                [None if s == "failed" else 0.9 for s in statuses], pa.float32()
            ),
            fmt.VERIFICATION_COLUMN: ["checked"] * n,
        }
    )


def make_input(path: Path, n: int = 30, rows_per_part: int = 10) -> VerifiedSnapshot:
    """Stage an input bundle of ``n`` rows in parts of ``rows_per_part``."""
    return stage(input_table(n), path, id_field="id", kind="input", rows_per_part=rows_per_part)


def make_result(
    path: Path, n: int = 30, rows_per_part: int = 10, outstanding: list[str] | None = None
) -> VerifiedSnapshot:
    """Stage a result bundle; with ``outstanding`` ids it is PARTIAL."""
    return stage_result(result_table(n), path, rows_per_part, outstanding)


def stage_result(
    table: pa.Table,
    path: Path,
    rows_per_part: int = 10,
    outstanding: list[str] | None = None,
    id_field: str = "id",
) -> VerifiedSnapshot:
    """Stage ``table`` (with its ``lithi_*`` columns) as a result bundle of job ``job-1``."""
    status = "PARTIAL" if outstanding else "SUCCEEDED"
    return stage(
        table,
        path,
        id_field=id_field,
        kind="result",
        rows_per_part=rows_per_part,
        job=JobInfo(job_id="job-1", status=status, attempt=1),
        input=INPUT_REF,
        outstanding_ids=outstanding,
    )


def load_manifest(bundle: Path) -> dict:
    """The manifest as plain JSON data, for editing."""
    return json.loads((bundle / fmt.MANIFEST_NAME).read_text())


def writable(path: Path) -> Path:
    """Make a staged (read-only) file writable again so a test can corrupt it; returns it."""
    if path.exists() and not path.is_symlink():
        os.chmod(path, 0o644)
    return path


def save_manifest(bundle: Path, data: dict) -> None:
    """Overwrite the manifest in place (tests only: real bundles are never modified)."""
    writable(bundle / fmt.MANIFEST_NAME).write_text(json.dumps(data, indent=2))


def write_bytes(path: Path, data: bytes) -> None:
    """Overwrite a staged file in place (tests only), read-only or not."""
    writable(path).write_bytes(data)


def rebind(bundle: Path, data: dict | None = None) -> dict:
    """Recompute every entry's sha256/bytes and content_sha256 from the files, and save.

    After rewriting a file's content this makes the digests right again, so the check under
    test is the one that fires rather than a digest mismatch.
    """
    data = data or load_manifest(bundle)
    entries = [*data["parts"], *([data["outstanding"]] if data["outstanding"] else [])]
    for e in entries:
        p = bundle / e["path"]
        e["sha256"] = sha256_file(p)
        e["bytes"] = p.stat().st_size
    data["snapshot"]["content_sha256"] = content_sha256((e["sha256"], e["path"]) for e in entries)
    save_manifest(bundle, data)
    return data


def rewrite_part(bundle: Path, rel: str, table: pa.Table) -> None:
    """Replace a bound Parquet file's content and rebind its digests in the manifest."""
    pq.write_table(table, writable(bundle / rel))
    rebind(bundle)


def footer_says(path: Path, rows: int) -> None:
    """Make a one-row-group Parquet file's footer claim ``rows`` rows while its row group keeps
    its own count (the file stays readable; only the two numbers disagree).

    In the footer's Thrift compact encoding, FileMetaData field 3 (``num_rows``, i64) follows the
    schema list as byte ``0x16`` and a zigzag varint; with plain column names it is the first
    such pair. Only single-byte varints (up to 63 rows) are rewritten, in place.
    """
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack("<i", data[-8:-4])
    start = len(data) - 8 - length
    before = pq.ParquetFile(path).metadata
    assert before.num_row_groups == 1 and before.num_rows < 64 and 0 <= rows < 64
    at = bytes(data[start:]).index(bytes([0x16, before.num_rows * 2]))
    data[start + at + 1] = rows * 2
    writable(path).write_bytes(bytes(data))
    after = pq.ParquetFile(path).metadata
    assert after.num_rows == rows and after.row_group(0).num_rows == before.num_rows


def nest(top: Path, depth: int) -> None:
    """``top/d/d/.../d``, ``depth`` levels, made one level at a time (``os.makedirs`` recurses)."""
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


def unnest(top: Path) -> None:
    """Remove what :func:`nest` made, bottom up, without recursion."""
    depth, d = 0, top
    while (d / "d").is_dir():
        d, depth = d / "d", depth + 1
    for level in range(depth, -1, -1):
        os.rmdir(top.joinpath(*["d"] * level))


def schema_file_text(schema: Schema) -> str:
    """The schema file for ``schema`` (what ``sources.read_schema_file`` reads back)."""
    return json.dumps(schema.model_dump(mode="json"), indent=2) + "\n"


def error_types(bundle: Path) -> list[type]:
    """The classes of every violation :func:`check` reports, in order."""
    return [type(e) for e in check(bundle).errors]


# -- reader bundles --------------------------------------------------------------------------

STATUS_CYCLE = ("accepted", "accepted", "failed", "abstained")


def reader_table(start: int, n: int, width: int = 4) -> pa.Table:
    """Rows ``start..start+n``: ids ``"00042"``, a float feature vector, statuses cycling."""
    i = np.arange(start, start + n)
    status = [STATUS_CYCLE[k % len(STATUS_CYCLE)] for k in i]
    conf = [None if s == "failed" else float(k % 10) / 10 for s, k in zip(status, i, strict=True)]
    feats = (i[:, None] * 10 + np.arange(width)[None, :]).astype(np.float32)
    return pa.table(
        {
            "item_id": pa.array([f"{k:05d}" for k in i], pa.string()),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(feats.ravel()), width),
            "label": pa.array(i % 7, pa.int64()),
            "lithi_status": pa.array(status, pa.string()),
            "lithi_confidence": pa.array(conf, pa.float32()),
            "lithi_verification": pa.array(["checked"] * n, pa.string()),
        }
    )


def make_bundle(root: Path, sizes: Sequence[int], name: str = "bundle") -> VerifiedSnapshot:
    """A verified result bundle whose parts hold exactly ``sizes`` rows (uneven on purpose)."""
    root.mkdir(parents=True, exist_ok=True)
    reused, start = [], 0
    for k, n in enumerate(sizes):
        # one single-part bundle per size, then bound again (hard links) as parts of the final
        piece = stage(
            reader_table(start, n),
            root / f".{name}-piece-{k}",
            id_field="item_id",
            kind="result",
            rows_per_part=max(n, 1),
            job=JOB,
            input=INPUT_REF,
        )
        reused.append(ReusedPart(piece.root, piece.manifest.parts[0]))
        start += n
    empty = reader_table(0, 0)
    stage(
        empty,
        root / name,
        id_field="item_id",
        kind="result",
        job=JOB,
        input=INPUT_REF,
        reuse_parts=reused,
    )
    return verify(root / name)


def edit_in_place(path: Path, at: int) -> None:
    """Flip byte ``at`` of ``path`` as any process of its owner can, and cover the tracks: same
    size, same inode, mode and mtime put back (only the ctime, which needs root, tells)."""
    st = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.chmod(path, st.st_mode & 0o777)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )
