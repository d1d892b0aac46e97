"""Duplicate-id detection: the project's 64-bit hash routine beside pyarrow's own kernels.

Answers one question for ``verify``, ``reconcile`` and the ``one_row_per_item`` check: are the
ids of a bundle unique, and if not, which repeat? Measured in this process on the same ids
(the ``narrow`` shape of ``bench/verify.py``: decimal-string ids, one chunk per part of about a
million rows), best of ``--repeat`` runs, as ratios against ``pc.value_counts`` (the baseline):

* ``value_counts``: ``pc.value_counts`` over the chunked ids, then the values counted > 1;
* ``group_by``: ``Table.group_by("id").aggregate([("id", "count")])`` (Acero, threaded);
* ``hash64, 1 thread``: :func:`pipeline.bundle.ids.duplicates` hashing every chunk itself;
* ``hash64, per-part threads``: the same with the chunk hashes computed in a thread pool, as
  ``verify`` does while it reads each part.

Run: ``.venv/bin/python bench/ids.py [--ids 13700000] [--repeat 3] [--duplicates 5]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from pipeline.bundle.digest import cpu_count  # noqa: E402
from pipeline.bundle.ids import duplicates, id_hashes  # noqa: E402

CHUNK = 1_141_000  # rows per part of the narrow 1 GB bundle (13.7M ids in a dozen parts)


def make_ids(n: int, dups: int) -> pa.ChunkedArray:
    """``n`` decimal-string ids in part-sized chunks; the last ``dups`` repeat earlier ones."""
    values = np.arange(n, dtype=np.int64)
    if dups:
        values[-dups:] = np.arange(dups)
    arr = pa.array(values).cast(pa.string())
    return pa.chunked_array([arr.slice(s, CHUNK) for s in range(0, n, CHUNK)])


def by_value_counts(ids: pa.ChunkedArray) -> tuple[int, list[str]]:
    vc = pc.value_counts(ids)
    dup = pc.filter(vc.field("values"), pc.greater(vc.field("counts"), 1))
    return len(dup), sorted(dup.to_pylist())[:5]


def by_group_by(ids: pa.ChunkedArray) -> tuple[int, list[str]]:
    counts = pa.table({"id": ids}).group_by("id").aggregate([("id", "count")])
    dup = pc.filter(counts["id"], pc.greater(counts["id_count"], 1))
    return len(dup), sorted(dup.to_pylist())[:5]


def by_hash64(ids: pa.ChunkedArray) -> tuple[int, list[str]]:
    return duplicates(list(ids.chunks))


def by_hash64_threads(ids: pa.ChunkedArray) -> tuple[int, list[str]]:
    chunks = list(ids.chunks)
    with ThreadPoolExecutor(max_workers=cpu_count()) as pool:
        hashes = list(pool.map(id_hashes, chunks))
    return duplicates(chunks, hashes=hashes)


METHODS: dict[str, Callable[[pa.ChunkedArray], tuple[int, list[str]]]] = {
    "value_counts (baseline)": by_value_counts,
    "group_by": by_group_by,
    "hash64, 1 thread": by_hash64,
    "hash64, per-part threads": by_hash64_threads,
}


def main() -> int:
    """Measure every method on the same ids and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ids", type=int, default=13_700_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duplicates", type=int, default=5)
    args = ap.parse_args()
    ids = make_ids(args.ids, args.duplicates)
    answers, best = {}, {}
    for _ in range(args.repeat):  # interleaved rounds, so a noisy moment hits every method
        for name, fn in METHODS.items():
            t = time.perf_counter()
            answers[name] = fn(ids)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
    if len({repr(a) for a in answers.values()}) != 1:
        print(f"methods disagree: {answers}", file=sys.stderr)
        return 1
    base = best["value_counts (baseline)"]
    print(f"{args.ids:,} ids in {len(ids.chunks)} chunks, {args.duplicates} duplicated, "
          f"{cpu_count()} CPUs, best of {args.repeat}")  # fmt: skip
    print(f"{'method':<28} {'seconds':>8} {'M ids/s':>8} {'x baseline':>10}")
    for name, s in best.items():
        print(f"{name:<28} {s:8.3f} {args.ids / s / 1e6:8.2f} {base / s:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
