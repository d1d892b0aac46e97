"""How close ``verify()`` runs to the machine's sha256 limit, against one-thread hashlib.

Builds (once, cached under ``bench/out/``) an input bundle of at least 1 GB of incompressible
random floats in several parts, then measures in this process, with the page cache warm:

* ``hashlib x1``: plain ``hashlib.file_digest`` over the same files, one thread (the baseline);
* ``sha256_files``: the project's parallel hashing alone (what the cores can do);
* ``verify()``: the whole check, hashing plus manifest, Parquet footers, id column, uniqueness;
* ``verify() minus hashing``: the same with every file trusted, i.e. the cost beyond sha256.

Ratios are against the baseline measured in the same run, so they compare across machines.
Run: ``.venv/bin/python bench/verify.py [--shape wide|narrow] [--gb 1.0] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from pipeline.bundle.digest import cpu_count, sha256_files  # noqa: E402
from pipeline.bundle.errors import BundleError  # noqa: E402
from pipeline.bundle.stage import ROW_GROUP_ROWS, stage  # noqa: E402
from pipeline.bundle.verify import verify  # noqa: E402

OUT = ROOT / "bench" / "out"
DIM = 256  # "wide": one fixed_size_list<float32,256> embedding per item, ~1 KB a row
FLOAT_COLUMNS = 8  # "narrow": eight float64 columns, ~73 B a row: 14x more ids per GB
SHAPES = {
    "wide": (
        pa.schema(
            [
                pa.field("id", pa.string(), nullable=False),
                pa.field("embedding", pa.list_(pa.float32(), DIM), nullable=False),
            ]
        ),
        4 * DIM + 9,
    ),
    "narrow": (
        pa.schema(
            [pa.field("id", pa.string(), nullable=False)]
            + [pa.field(f"f{i}", pa.float64()) for i in range(FLOAT_COLUMNS)]
        ),
        8 * FLOAT_COLUMNS + 9,
    ),
}


def batches(shape: str, rows: int, seed: int = 0) -> Iterator[pa.RecordBatch]:
    """Random rows in record batches: generated as staged, never all in memory."""
    schema, _ = SHAPES[shape]
    rng = np.random.default_rng(seed)
    for start in range(0, rows, ROW_GROUP_ROWS):
        n = min(ROW_GROUP_ROWS, rows - start)
        ids = pa.array(np.arange(start, start + n)).cast(pa.string())
        if shape == "wide":
            flat = pa.array(rng.random(n * DIM, dtype=np.float32))
            cols = [pa.FixedSizeListArray.from_arrays(flat, DIM)]
        else:
            cols = [pa.array(rng.random(n)) for _ in range(FLOAT_COLUMNS)]
        yield pa.RecordBatch.from_arrays([ids, *cols], schema=schema)


def bundle(gb: float, shape: str) -> Path:
    """The cached benchmark bundle, staged now if absent or invalid."""
    return cached_bundle(OUT / f"verify-{shape}-{gb:g}gb", gb, shape)


def cached_bundle(dest: Path, gb: float, shape: str, part_bytes: int | None = None) -> Path:
    """``gb`` of ``shape`` rows at ``dest``, staged now if absent or invalid: in parts of about
    ``part_bytes``, or a dozen parts (enough to keep every core hashing)."""
    for stale in dest.parent.glob(f".{dest.name}.staging-*"):  # left by an interrupted run
        shutil.rmtree(stale)
    if dest.exists():
        try:
            verify(dest)
            return dest
        except BundleError as e:
            print(f"cached bundle invalid ({type(e).__name__}); restaging", file=sys.stderr)
            shutil.rmtree(dest)
    schema, row_bytes = SHAPES[shape]
    rows = int(gb * 1e9 / row_bytes) + 1
    print(f"staging {rows:,} rows (~{gb:g} GB) into {dest.relative_to(ROOT)} ...", file=sys.stderr)
    t = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    per_part = part_bytes // row_bytes if part_bytes else max(1, rows // 12)
    stage(
        batches(shape, rows),
        dest,
        id_field="id",
        kind="input",
        schema=schema,
        rows_per_part=per_part,
    )
    print(f"staged in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return dest


def hashlib_one_thread(paths: list[Path]) -> None:
    """The baseline: the standard library's own file hashing, one file after another."""
    for p in paths:
        with open(p, "rb") as f:
            hashlib.file_digest(f, "sha256")


def timed(methods: list[tuple[str, Callable[[], object]]], repeat: int) -> list[tuple[str, float]]:
    """Best wall time of each method over ``repeat`` interleaved rounds.

    Interleaving spreads any background load evenly over the methods, and the minimum is the
    run least disturbed by it, so ratios stay meaningful on a busy machine.
    """
    best = {name: float("inf") for name, _ in methods}
    for _ in range(repeat):
        for name, fn in methods:
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return [(name, best[name]) for name, _ in methods]


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the bundle, measure, print the table; exit 1 if it is smaller than 1 GB."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="bundle size to build (default 1)")
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="wide",
        help="wide: 1 KB embedding rows (default); narrow: 73 B rows, 14x more ids to check",
    )
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (best is shown)")
    args = ap.parse_args(argv)

    root = bundle(args.gb, args.shape)
    snap = verify(root)
    paths = [root / f.path for f in snap.manifest.bound_files]
    total = snap.stats.bytes_total
    hashlib_one_thread(paths)  # warm the page cache: measure hashing, not the disk

    rows = timed(
        [
            ("hashlib x1 (baseline)", lambda: hashlib_one_thread(paths)),
            (f"sha256_files x{cpu_count()}", lambda: sha256_files(paths)),
            ("verify()", lambda: verify(root)),
            ("verify() minus hashing", lambda: verify(root, trusted=lambda p, e: True)),
        ],
        args.repeat,
    )
    base = rows[0][1]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"bundle ({args.shape}): {total / 1e9:.2f} GB in {len(paths)} parts, "
        f"{snap.manifest.counts.items:,} items; cpus: {cpu_count()}; load avg {load:.1f}; "
        f"warm page cache; best of {args.repeat}"
    )
    print(f"{'method':<26}{'seconds':>9}{'MB/s':>9}{'x baseline':>12}")
    for name, secs in rows:
        print(f"{name:<26}{secs:>9.3f}{total / secs / 1e6:>9.0f}{base / secs:>12.2f}")
    return 0 if total >= 1e9 else 1


if __name__ == "__main__":
    sys.exit(main())
