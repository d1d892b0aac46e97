"""Reader throughput against the raw decode limit, measured in the same run, plus peak memory.

Builds (once, cached under ``bench/out/``) a result bundle of 2**20 rows: string ids, 64 float32
features as one ``fixed_size_list<float32,64>`` column (how embeddings and feature vectors are
usually stored: one column, one 256-byte row, decoded as a single [B, 64] tensor), an int64
label and the lithi columns. Prints rows/s with 2 DataLoader workers and batch 256 for the
map-style reader shuffled, the iterable reader, a naive per-row ``__getitem__`` baseline
(measured on a prefix and extrapolated), and the raw pyarrow decode limit (``read_table`` plus
conversion to tensors, one process, no DataLoader), each as a ratio of the limit. Then the peak
RSS of the iterable reader over a 1x and a 4x bundle, each in a fresh child process.
The raw limit is measured first and last and the higher one counts (after one untimed run:
a fresh process's first decode also pays for fresh memory). Two rows isolate what resume
support costs (the same inner DataLoader finished and cut without the loader's counting) and one
what a resume costs (the second half of an epoch, timed from a fresh loader's load_state_dict).

    .venv/bin/python bench/loader.py [--rows N] [--skip-rss] [--rounds N]

``--rounds N`` runs only the default wiring N times, each round against its own limit, and prints
the median and range of each ratio: on a machine whose speed drifts, one table can mislead. Each
round also runs the cold map-style epoch with ``share_decoded=False`` (every worker decodes the
parts it touches, the wiring before decoded parts were shared), so the two compare in one round.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.bundle.manifest import InputRef, JobInfo  # noqa: E402
from pipeline.bundle.stage import stage  # noqa: E402
from pipeline.bundle.verify import verify  # noqa: E402
from pipeline.readers import MapDataset, OwnerSampler, collate_batches  # noqa: E402
from pipeline.readers.index import Index  # noqa: E402
from pipeline.readers.loader import (  # noqa: E402
    ReaderLoader,
    _auto_transfer,
    _cut,
    make_loader,
    set_epoch,
)
from pipeline.readers.map_style import coded_columns  # noqa: E402
from pipeline.readers.tensors import to_batch, wire_to_batch  # noqa: E402

OUT = Path(__file__).with_name("out")
BATCH = 256
WORKERS = 2
TRANSFER = _auto_transfer(BATCH)  # make_loader's default batches per worker message
FEATURES = 64
STATUSES = np.array(["accepted", "failed", "abstained"])

SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("x", pa.list_(pa.float32(), FEATURES), nullable=False),
        pa.field("label", pa.int64(), nullable=False),
        pa.field("lithi_status", pa.string(), nullable=False),
        pa.field("lithi_confidence", pa.float32(), nullable=True),
        pa.field("lithi_verification", pa.string(), nullable=False),
    ]
)


def bench_rows(
    rows: int, chunk: int = 65_536, label: Callable[[np.ndarray], np.ndarray] | None = None
):
    """The bench rows: ``label`` maps row numbers to labels (default: ten labels in turn)."""
    rng = np.random.default_rng(0)
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        i = np.arange(start, start + n)
        status = STATUSES[rng.choice(3, n, p=[0.8, 0.1, 0.1])]
        conf = rng.random(n, dtype=np.float32)
        feats = rng.standard_normal((n, FEATURES), dtype=np.float32)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([f"{k:08d}" for k in i], pa.string()),
                pa.FixedSizeListArray.from_arrays(pa.array(feats.ravel()), FEATURES),
                pa.array(i % 10 if label is None else label(i), pa.int64()),
                pa.array(status),
                pa.array(conf, mask=status == "failed"),
                pa.array(np.where(status == "accepted", "checked", "none")),
            ],
            schema=SCHEMA,
        )


def bundle(rows: int) -> Index:
    """The cached bench bundle of ``rows`` rows, staged on first use and verified every time."""
    return staged(OUT / f"loader-{rows}", bench_rows(rows))


def staged(dest: Path, batches: Iterable[pa.RecordBatch], **kw: Any) -> Index:
    """The result bundle at ``dest`` (staged from ``batches`` first if absent), verified."""
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        stage(
            batches,
            dest,
            schema=SCHEMA,
            id_field="item_id",
            kind="result",
            job=JobInfo(job_id="bench", status="SUCCEEDED", attempt=1),
            input=InputRef(version_id="bench-input", content_sha256="0" * 64),
            **kw,
        )
        print(f"staged in {time.perf_counter() - t:.1f} s at {dest.name}")
    return Index.from_snapshot(verify(dest))


def raw_limit(index: Index, coded: bool = False) -> float:
    """rows/s of read_table + to_batch per 256-row slice, one process, no DataLoader.

    ``coded`` reads the columns the readers read dictionary-encoded that way too (an
    informational row: the limit the ratios use is the plain read).
    """
    read_dictionary = coded_columns(index, index.schema.names) if coded else None
    t = time.perf_counter()
    rows = 0
    for path in index.part_paths:
        table = pq.read_table(path, read_dictionary=read_dictionary)
        for off in range(0, table.num_rows, BATCH):
            b = to_batch(table.slice(off, BATCH), index.schema)
            rows += len(b["item_id"])
    return rows / (time.perf_counter() - t)


def loader_rate(loader, limit_batches: int | None = None) -> float:
    t = time.perf_counter()
    rows = 0
    it = iter(loader)
    if limit_batches is not None:
        it = itertools.islice(it, limit_batches)
    for b in it:
        rows += len(b["item_id"])
    return rows / (time.perf_counter() - t)


def bare_rate(loader: ReaderLoader) -> float:
    """rows/s of the same inner DataLoader, finished and cut by hand without any counting."""
    t = time.perf_counter()
    rows = 0
    for _, wire in loader.loader:  # (worker tag, wire batch)
        big = wire_to_batch(wire)
        for b in _cut(big, BATCH, len(big["item_id"])):
            rows += len(b["item_id"])
    return rows / (time.perf_counter() - t)


def resumed_rate(index: Index, kw: dict) -> float:
    """rows/s of the second half of an epoch, timed from a fresh loader's load_state_dict."""
    first = make_loader(index, **kw)
    half = len(first) // 2
    it = iter(first)
    for _ in range(half):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    t = time.perf_counter()
    again = make_loader(index, **kw)
    again.load_state_dict(state)
    rows = sum(len(b["item_id"]) for b in again)
    return rows / (time.perf_counter() - t)


def bookkeeping_seconds(index: Index) -> tuple[float, float]:
    """Main-process seconds per epoch to cut 4,096-row batches into batch-256 views with and
    without ReaderLoader's counting (best of 5, alternating), over batches already received:
    what resume support adds, without the noise of the workers around it."""
    loader = make_loader(
        index, style="map", batch_size=BATCH, num_workers=0, transfer_batches=TRANSFER
    )
    bigs = [wire_to_batch(w) for _, w in loader.loader]
    with_, without = [], []
    for _ in range(5):
        t = time.perf_counter()
        for big in bigs:
            for _b in _cut(big, BATCH, len(big["item_id"])):
                pass
        without.append(time.perf_counter() - t)
        t = time.perf_counter()
        for big in bigs:
            for _b in loader._deliver(0, big):
                pass
        with_.append(time.perf_counter() - t)
    return min(with_), min(without)


class PerRow(MapDataset):
    """The naive baseline: torch's fetcher calls ``__getitem__`` once per row, then collates."""

    __getitems__ = None


def rss_child(rows: int) -> None:
    """(In a child) stream the iterable reader once and print peak RSS of it and its workers."""
    index = bundle(rows)
    n = 0
    loader = make_loader(
        index, style="iterable", batch_size=BATCH, num_workers=WORKERS, transfer_batches=TRANSFER
    )
    for b in loader:
        n += len(b["item_id"])
    assert n == rows, (n, rows)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{own:.0f} {kids:.0f}")


def first_touch_us(mib: int = 256) -> float:
    """Microseconds per 4 KiB page to first touch ``mib`` MiB of fresh anonymous memory.

    Fresh worker processes decode into memory they get from the kernel, so a machine where that
    is slow (a VM whose host backs guest pages lazily measured 4-40 us here, against well under
    1 us on bare metal) slows every cold epoch; printed beside each round to tell the two apart.
    """
    import mmap

    m = mmap.mmap(-1, mib << 20)
    view = np.frombuffer(m, dtype=np.uint8)
    t = time.perf_counter()
    view[::4096] = 1
    us = (time.perf_counter() - t) / ((mib << 20) >> 12) * 1e6
    del view
    m.close()
    return us


def rounds(index: Index, n: int) -> None:
    """n rounds of the default wiring, each ratio against its own round's limit (the highest of
    three: before, between the map-style and the iterable epochs, and after); prints every round
    and the median, so a noisy machine shows as a range."""
    kw = dict(batch_size=BATCH, num_workers=WORKERS)
    names = [
        "map cold",
        "map warm",
        "map cold unshared",
        "iterable",
        "iterable shuffled",
        "iterable resumed",
    ]
    ratios: dict[str, list[float]] = {k: [] for k in names}
    for r in range(n):
        before = raw_limit(index)
        # the opt-out (each worker decodes for itself, as before the shared parts) in the same
        # round, before the shared epochs in odd rounds and after them in even ones
        unshared = make_loader(index, style="map", share_decoded=False, **kw)
        unshared_rate = loader_rate(unshared) if r % 2 else None
        del unshared
        m = make_loader(index, style="map", shuffle=True, **kw)
        rates = [loader_rate(m)]
        set_epoch(m, 1)
        rates.append(loader_rate(m))
        del m
        if unshared_rate is None:
            unshared_rate = loader_rate(make_loader(index, style="map", share_decoded=False, **kw))
        rates.append(unshared_rate)
        middle = raw_limit(index)
        rates.append(loader_rate(make_loader(index, style="iterable", shuffle=False, **kw)))
        rates.append(loader_rate(make_loader(index, style="iterable", shuffle=True, **kw)))
        rates.append(resumed_rate(index, dict(style="iterable", shuffle=False, **kw)))
        limit = max(before, middle, raw_limit(index))
        for k, v in zip(names, rates, strict=True):
            ratios[k].append(v / limit)
        # measured after the round: touching fresh memory first would warm it for the readers
        touch = first_touch_us()
        print(
            f"round {r + 1}: limit {limit:,.0f} rows/s, first touch {touch:.1f} us/page; "
            + ", ".join(f"{k} {v / limit:.2f}" for k, v in zip(names, rates, strict=True))
        )
    for k, v in ratios.items():
        v = sorted(v)
        print(f"{k:20s} median {v[len(v) // 2]:.2f}  (min {v[0]:.2f}, max {v[-1]:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2**20)
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--rss-child", type=int)
    ap.add_argument("--rounds", type=int, default=0, help="only N rounds of the default wiring")
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child)
        return
    index = bundle(args.rows)
    if args.rounds:
        raw_limit(index)  # untimed, as in the single run
        rounds(index, args.rounds)
        return
    print(
        f"bundle: {len(index):,} rows in {len(index.part_rows)} parts; batch {BATCH}, "
        f"{WORKERS} workers"
    )
    results: dict[str, float] = {}
    raw_limit(index)  # untimed: a fresh process's first decode also pays for fresh memory
    first_limit = raw_limit(index)
    for k in (1, TRANSFER):
        tag = f"transfer_batches={k}" + (" (default)" if k == TRANSFER else "")
        kw = dict(batch_size=BATCH, num_workers=WORKERS, transfer_batches=k)
        m = make_loader(index, style="map", shuffle=True, **kw)
        results[f"map-style shuffled, epoch 1 (cold), {tag}"] = loader_rate(m)
        if k == TRANSFER:
            results[f"  same, share_decoded=False (each worker decodes), {tag}"] = loader_rate(
                make_loader(index, style="map", shuffle=True, share_decoded=False, **kw)
            )
        set_epoch(m, 1)
        results[f"map-style shuffled, epoch 2 (warm), {tag}"] = loader_rate(m)
        if k == TRANSFER:  # best of two, alternating, so neither gets the quieter moment
            with_, without = [], []
            for e in (2, 3):
                set_epoch(m, e)
                without.append(bare_rate(m))
                set_epoch(m, e + 2)
                with_.append(loader_rate(m))
            results[f"  same, warm, best of 2, {tag}"] = max(with_)
            results[f"  same, warm, best of 2, without resume bookkeeping, {tag}"] = max(without)
        it = make_loader(index, style="iterable", shuffle=False, **kw)
        results[f"iterable, {tag}"] = loader_rate(it)
        if k == TRANSFER:
            with_, without = [], []
            for _ in range(2):
                without.append(bare_rate(it))
                with_.append(loader_rate(it))
            results[f"  same, best of 2, {tag}"] = max(with_)
            results[f"  same, best of 2, without resume bookkeeping, {tag}"] = max(without)
            results[f"  same, resumed at mid-epoch (from load_state_dict), {tag}"] = resumed_rate(
                index, dict(style="iterable", shuffle=False, **kw)
            )
        its = make_loader(index, style="iterable", shuffle=True, **kw)
        results[f"iterable, shuffled row groups, {tag}"] = loader_rate(its)
        del m
    naive = PerRow(index)
    from torch.utils.data import DataLoader

    nl = DataLoader(
        naive,
        batch_size=BATCH,
        sampler=OwnerSampler(index, shuffle=True),
        num_workers=WORKERS,
        collate_fn=collate_batches,
    )
    results["naive per-row __getitem__ (80 batches)"] = loader_rate(nl, limit_batches=80)
    # the limit is measured first and last; the higher one counts, so load that comes and goes
    # during the run can only lower the ratios
    limit = max(first_limit, raw_limit(index))
    coded = raw_limit(index, coded=True)
    results = {
        "raw pyarrow decode limit (1 process, best of first and last)": limit,
        "  same, lithi_status/verification read dictionary-encoded as the readers do": coded,
        **results,
    }
    print(f"limit first {first_limit:,.0f} rows/s, last {results[next(iter(results))]:,.0f}")
    print(f"{'reader':72s} {'rows/s':>10s} {'x limit':>8s}")
    for name, rate in results.items():
        print(f"{name:72s} {rate:10,.0f} {rate / limit:8.2f}")
    with_, without = bookkeeping_seconds(index)
    warm = len(index) / results["map-style shuffled, epoch 2 (warm), transfer_batches=16 (default)"]
    print(
        f"resume bookkeeping, main process, per epoch: cutting {without * 1e3:.1f} ms, cutting "
        f"and counting {with_ * 1e3:.1f} ms: {(with_ - without) / warm:+.2%} of a warm "
        f"map-style epoch ({warm:.2f} s)"
    )
    if args.skip_rss:
        return
    print("peak RSS of the iterable reader (MiB; main process / largest worker):")
    for k in (1, 4):
        rows = args.rows * k
        bundle(rows)  # staged outside the measured child
        out = subprocess.run(
            [sys.executable, __file__, "--rss-child", str(rows)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        print(f"  {k}x = {rows:>10,} rows: main {out[-2]} MiB, worker {out[-1]} MiB")


if __name__ == "__main__":
    main()
