"""Shuffle quality and what it costs: the readers with and without ``mix``, beside torch's samplers.

Builds (once, cached under ``bench/out/``) a bundle staged in label order, as Compute outputs
that come back job by job often are: ``--parts`` parts of equal size, part ``k`` holding label
``k`` only, rows as ``bench/loader.py``'s (a 64-float vector, string ids, lithi columns), in
the staging defaults' row groups. Then, for the map-style and the iterable reader, each without
and with ``mix``, and for torch's ``RandomSampler`` and ``DistributedSampler`` over the same
positions, it reports:

* same-part adjacent pairs: the share of consecutive items of rank 0's epoch from one part
  (``1 / parts`` for a uniform shuffle of equal parts, 1.0 for part after part);
* labels per rank: the fewest labels any of ``W`` ranks sees in an epoch (all of them is the
  goal; computed from every rank's planned positions, no data read);
* parts per batch: the mean number of parts a full batch of rank 0 draws from, and the share of
  its batches drawn from one part only (from the batches the reader delivered);
* rows/s: rank 0 of ``W`` reading its share of an epoch (fresh loader, ``WORKERS`` DataLoader
  workers, batch 256), then of the next epoch on the same loader (where the map-style reader's
  workers find the parts they decoded), each as a ratio of the decode limit measured in the
  same run (``read_table`` plus conversion to tensors, one process, as ``bench/loader.py``
  measures it).

Torch's samplers read nothing here: they are the quality a uniform shuffle gives, not a reader.

    .venv/bin/python bench/shuffle.py [--rows N] [--parts 8] [--worlds 1,3,4] [--rounds 3]
                                      [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DistributedSampler, RandomSampler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loader import BATCH, WORKERS, bench_rows, raw_limit, staged  # noqa: E402
from pipeline.readers import OwnerSampler, PartIterableDataset, make_loader, set_epoch  # noqa: E402
from pipeline.readers.index import Index  # noqa: E402

OUT = Path(__file__).with_name("out")
SEED, EPOCH = 0, 1


def sorted_bundle(rows: int, parts: int, out: Path = OUT) -> Index:
    """The cached label-sorted bundle (label = the part a row is staged in), verified."""
    return staged(
        out / f"shuffle-{rows}-{parts}",
        bench_rows(rows, label=lambda i: i * parts // rows),
        rows_per_part=-(-rows // parts),
    )


def same_part_pairs(labels: np.ndarray) -> float:
    return float(np.mean(labels[1:] == labels[:-1])) if len(labels) > 1 else 0.0


def batch_parts(batches: list[np.ndarray]) -> tuple[float, float]:
    """(mean parts per full batch, share of full batches from one part)."""
    full = [len(np.unique(b)) for b in batches if len(b) == BATCH] or [0]
    return float(np.mean(full)), float(np.mean([n == 1 for n in full]))


def planned_positions(index: Index, style: str, mix: bool, rank: int, world: int) -> np.ndarray:
    """Every position rank ``rank`` of ``world`` reads this epoch, from the plan alone."""
    if style == "map":
        sampler = OwnerSampler(index, rank=rank, world_size=world, seed=SEED, mix=mix)
        sampler.set_epoch(EPOCH)
        return sampler.positions()
    ds = PartIterableDataset(
        index,
        batch_size=BATCH,
        shuffle=True,
        seed=SEED,
        rank=rank,
        world_size=world,
        num_workers=WORKERS,
        mix=mix,
    )
    ds.set_epoch(EPOCH)
    return np.concatenate([ds.stream_positions(o) for o in ds.owners()])


def fewest_labels(positions: list[np.ndarray], label_of: np.ndarray) -> int:
    return min(len(np.unique(label_of[p])) for p in positions)


def reader_row(index: Index, style: str, mix: bool, world: int, quality: bool) -> dict:
    """Rank 0's rows/s over an epoch and the next; with ``quality``, the shuffle's measures."""
    loader = make_loader(
        index,
        style=style,
        batch_size=BATCH,
        num_workers=WORKERS,
        shuffle=True,
        mix=mix,
        seed=SEED,
        rank=0,
        world_size=world,
    )
    set_epoch(loader, EPOCH)
    batches: list[np.ndarray] = []
    t = time.perf_counter()
    for b in loader:
        batches.append(b["label"].numpy())
    row: dict = {"rate": sum(len(b) for b in batches) / (time.perf_counter() - t)}
    set_epoch(loader, EPOCH + 1)  # a second epoch: the map-style reader's decoded parts kept
    t = time.perf_counter()
    row["again"] = sum(len(b["label"]) for b in loader) / (time.perf_counter() - t)
    if quality:
        label_of = np.repeat(np.arange(len(index.part_rows)), index.part_rows)
        shares = [planned_positions(index, style, mix, r, world) for r in range(world)]
        row["same"] = same_part_pairs(np.concatenate(batches))
        row["labels"] = fewest_labels(shares, label_of)
        row["parts"], row["single"] = batch_parts(batches)
    return row


def sampler_row(index: Index, world: int) -> dict:
    """torch's sampler for this world size: RandomSampler for 1, DistributedSampler beyond."""
    label_of = np.repeat(np.arange(len(index.part_rows)), index.part_rows)
    n = len(index)

    def order(rank: int) -> np.ndarray:
        if world == 1:
            return np.fromiter(
                RandomSampler(range(n), generator=torch.Generator().manual_seed(SEED)), np.int64, n
            )
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=SEED)
        sampler.set_epoch(EPOCH)
        return np.fromiter(sampler, np.int64)

    shares = [order(r) for r in range(world)]
    labels = label_of[shares[0]]
    batches = [labels[i : i + BATCH] for i in range(0, len(labels), BATCH)]
    mean_parts, single = batch_parts(batches)
    return {
        "same": same_part_pairs(labels),
        "labels": fewest_labels(shares, label_of),
        "parts": mean_parts,
        "single": single,
    }


def _spread(values: list[float]) -> str:
    v = sorted(values)
    return f"{v[len(v) // 2]:.2f} ({v[0]:.2f}-{v[-1]:.2f})"


def _print_row(label: str, world: int, q: dict, ratios: list | None, parts: int) -> None:
    rates = ["-", "-"] if ratios is None else [_spread([r[i] for r in ratios]) for i in (0, 1)]
    print(
        f"{label:26s} {world:2d} {q['same']:15.3f} {q['labels']:>5d} of {parts:<3d} "
        f"{q['parts']:11.2f} {q['single']:14.2f} {rates[0]:>17s} {rates[1]:>17s}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2**21)
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--worlds", default="1,3,4", help="rank counts, comma-separated")
    ap.add_argument("--out", type=Path, default=OUT, help="where the bundle is staged and kept")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (quality: the first)")
    args = ap.parse_args(argv)
    index = sorted_bundle(args.rows, args.parts, args.out)
    print(
        f"bundle: {len(index):,} rows in {len(index.part_rows)} label-sorted parts; "
        f"batch {BATCH}, {WORKERS} workers, rank 0 of W timed"
    )
    raw_limit(index)  # untimed: a fresh process's first decode also pays for fresh memory
    worlds = [int(w) for w in args.worlds.split(",")]
    readers = [(style, mix) for style in ("map", "iterable") for mix in (False, True)]
    quality = {(w, s, m): {} for w in worlds for s, m in readers}
    ratios: dict[tuple, list[tuple[float, float]]] = {k: [] for k in quality}
    limits = []
    for r in range(args.rounds):
        before = raw_limit(index)
        rates = {}
        for world in worlds:
            for style, mix in readers[:: 1 if r % 2 == 0 else -1]:  # alternate who goes first
                row = reader_row(index, style, mix, world, quality=r == 0)
                rates[world, style, mix] = (row.pop("rate"), row.pop("again"))
                if r == 0:
                    quality[world, style, mix] = row
        limit = max(before, raw_limit(index))  # the higher of before and after the round
        limits.append(limit)
        for k, (one, two) in rates.items():
            ratios[k].append((one / limit, two / limit))
    print(
        f"decode limit {min(limits):,.0f}-{max(limits):,.0f} rows/s over {args.rounds} round(s); "
        "rates: median (min-max) of each round's rows/s over that round's limit\n"
    )
    print(
        f"{'reader':26s} {'W':>2s} {'same-part pairs':>15s} {'labels/rank':>11s} "
        f"{'parts/batch':>11s} {'1-part batches':>14s} {'epoch 1 vs limit':>17s} "
        f"{'epoch 2 vs limit':>17s}"
    )
    for world in worlds:
        torch_name = "torch RandomSampler" if world == 1 else "torch DistributedSampler"
        _print_row(torch_name, world, sampler_row(index, world), None, args.parts)
        for style, mix in readers:
            label = f"{style}{' mix' if mix else ''}"
            k = (world, style, mix)
            _print_row(label, world, quality[k], ratios[k], args.parts)
    print("\nmix / plain, epoch 1 (each round's pair):")
    for world in worlds:
        for style in ("map", "iterable"):
            pairs = [
                m[0] / p[0]
                for m, p in zip(
                    ratios[world, style, True], ratios[world, style, False], strict=True
                )
            ]
            print(f"  {style:8s} W={world}: {_spread(pairs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
