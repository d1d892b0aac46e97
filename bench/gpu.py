"""What the reader and the reference training step cost a CUDA device, each beside its limit.

Sized for a short loan of one GPU (one H200, 16 cores: well under 5 minutes at the default
2,000,000 items). Stages a synthetic result bundle with the project's own staging (string ids,
a 64-float ``embedding`` in 10 learnable classes, the ``lithi_*`` columns, ``lithi_label`` set
on accepted rows), verifies it, indexes it and reads it with ``make_loader`` (map-style,
shuffled, pinned on CUDA). Then, in one run, each figure beside a limit measured in that run:

1. host to device: rows/s of the loader's batches moved with ``to_device`` (non-blocking, one
   synchronize at the end), against a raw pinned ``copy_`` of tensors of the same shapes and
   dtypes, pre-allocated on both sides (the PCIe and launch limit, no reader in the way). The
   limit is measured before and after the loader's epoch and the higher counts.
2. GPU idle waiting for data: one training epoch with the reference trainer's step
   (``fit_tensors``, which with workers they derive on the host as they read and without them
   is ``to_device`` then ``to_features``; loss, backward, Adam, running sums kept on the
   device), with the reference MLP (hidden 128) and one 10x wider (hidden 1280).
   The limit is the same number of steps on one batch already on the device (its masks built
   once), timed before and after the epoch, the faster counting; idle = 1 - compute / epoch.
   A step the GPU finishes faster than the host can prepare the next batch shows as idle.
3. exactly once: every id both training epochs yielded, tallied with the pipeline's ``Tally``
   (inside the timed loop, as the pipeline's loaders tally every pass) and reconciled against
   the manifest: duplicates, missing ids, counts by status.

Without CUDA it says so and exits 0; ``--allow-cpu`` runs the same measurements on the CPU
(no pinning, a small default size) so the logic can be checked anywhere. The process exits 1
if an epoch does not reconcile.

    .venv/bin/python bench/gpu.py [--items N] [--workers N] [--batch-size N] [--out DIR]
    .venv/bin/python bench/gpu.py --allow-cpu [--items 20000]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from pipeline.bundle import format as fmt  # noqa: E402
from pipeline.bundle.manifest import InputRef, JobInfo  # noqa: E402
from pipeline.bundle.stage import stage  # noqa: E402
from pipeline.bundle.verify import verify  # noqa: E402
from pipeline.readers.index import Index  # noqa: E402
from pipeline.readers.loader import ReaderLoader, make_loader  # noqa: E402
from pipeline.readers.reconcile import ReconcileReport, Tally, reconcile  # noqa: E402
from pipeline.training.device import choose_device, to_device, wants_pinned_memory  # noqa: E402
from pipeline.training.feature_fit import fit_spec  # noqa: E402
from pipeline.training.features import FeatureSpec, to_features  # noqa: E402
from pipeline.training.fit import (  # noqa: E402
    WEIGHT,
    X,
    Y,
    batch_tensors,
    fit_tensors,
    train_step,
)
from pipeline.training.model import MLP  # noqa: E402
from pipeline.training.reference_config import ReferenceConfig  # noqa: E402

ID_FIELD = "item_id"
FEATURE = "embedding"
DIM = 64
CLASSES = 10
SEPARATION = 0.45  # class centres' spread against unit noise, as the pipeline's synthetic sample
CHUNK = 65_536  # rows generated (and held) at once; also a part's row group
ROWS_PER_PART = 65_536  # enough parts that the shuffled map-style reader spreads over workers
STATUSES = np.array(fmt.STATUSES)
HIDDEN = 128  # the reference trainer's default
WIDE = 10 * HIDDEN
CUDA_ITEMS = 2_000_000
CPU_ITEMS = 50_000
WARMUP_STEPS = 10  # untimed: cuBLAS handles, Adam's state and the allocator's first blocks

SCHEMA = pa.schema(
    [
        pa.field(ID_FIELD, pa.string(), nullable=False),
        pa.field(FEATURE, pa.list_(pa.float32(), DIM), nullable=False),
        pa.field(fmt.STATUS_COLUMN, pa.string(), nullable=False),
        pa.field(fmt.CONFIDENCE_COLUMN, pa.float32(), nullable=True),
        pa.field(fmt.VERIFICATION_COLUMN, pa.string(), nullable=False),
        pa.field(fmt.LABEL_COLUMN, pa.int64(), nullable=True),
    ]
)


# -- the bundle -----------------------------------------------------------------------------------


def _ids(start: int, stop: int) -> pa.Array:
    """``gpu-0000000042``-style ids, vectorised: millions of Python strings would dominate."""
    digits = pc.utf8_lpad(
        pa.array(np.arange(start, stop, dtype=np.int64)).cast(pa.string()), 10, "0"
    )
    return pc.binary_join_element_wise("gpu-", digits, "")


def _batches(items: int, seed: int = 0) -> Iterator[pa.RecordBatch]:
    """The result rows a labeller would write: accepted rows carry a label and a confidence,
    failed ones neither, abstained ones a confidence only. One chunk in memory at a time."""
    centres = np.random.default_rng([seed, 0]).standard_normal((CLASSES, DIM)) * SEPARATION
    centres = centres.astype(np.float32)
    for lo in range(0, items, CHUNK):
        n = min(CHUNK, items - lo)
        rng = np.random.default_rng([seed, lo])
        cls = rng.integers(0, CLASSES, n)
        emb = centres[cls] + rng.standard_normal((n, DIM), dtype=np.float32)
        status = STATUSES[rng.choice(len(STATUSES), n, p=[0.8, 0.1, 0.1])]
        accepted = status == "accepted"
        yield pa.RecordBatch.from_arrays(
            [
                _ids(lo, lo + n),
                pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), DIM),
                pa.array(status, pa.string()),
                pa.array(rng.random(n, dtype=np.float32), mask=status == "failed"),
                pa.array(np.where(accepted, "checked", "none"), pa.string()),
                pa.array(cls, pa.int64(), mask=~accepted),
            ],
            schema=SCHEMA,
        )


def bundle(out: Path, items: int) -> Index:
    """The result bundle of ``items`` rows under ``out`` (staged unless already there), verified
    in full and indexed, as the pipeline does before any reader touches it."""
    dest = out / f"gpu-{items}"
    if not dest.exists():
        t = time.perf_counter()
        stage(
            _batches(items),
            dest,
            schema=SCHEMA,
            id_field=ID_FIELD,
            kind="result",
            rows_per_part=ROWS_PER_PART,
            job=JobInfo(job_id="bench-gpu", status="SUCCEEDED", attempt=1),
            input=InputRef(version_id="bench-input", content_sha256="0" * 64),
        )
        print(f"staged {items:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
    t = time.perf_counter()
    index = Index.from_snapshot(verify(dest))
    print(
        f"verified and indexed {len(index):,} rows in {len(index.part_rows)} parts in "
        f"{time.perf_counter() - t:.1f} s",
        flush=True,
    )
    return index


# -- timing ---------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    """Wait for the device's queued work: copies and kernels return before they finish."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_kept(batches: Iterable[dict], keep: list[dict]) -> Iterator[dict]:
    """``batches`` unchanged, the first one also kept (its shapes size the limits)."""
    for b in batches:
        if not keep:
            keep.append(b)
        yield b


def loader_h2d(loader: ReaderLoader, device: torch.device) -> tuple[int, float]:
    """Rows and seconds of one epoch of the loader's batches moved to ``device``."""
    rows = 0
    sync(device)
    t = time.perf_counter()
    for batch in loader:
        to_device(batch, device)
        rows += len(batch[ID_FIELD])
    sync(device)
    return rows, time.perf_counter() - t


def pinned_copy_rate(sample: dict, batches: int, device: torch.device) -> float:
    """rows/s of ``batches`` copies of ``sample``'s tensors from pre-allocated pinned host
    buffers into pre-allocated device buffers (non-blocking, one synchronize at the end)."""
    pin = device.type == "cuda"
    tensors = {k: v for k, v in sample.items() if isinstance(v, torch.Tensor)}
    src = [torch.empty(v.shape, dtype=v.dtype, pin_memory=pin).copy_(v) for v in tensors.values()]
    dst = [torch.empty(v.shape, dtype=v.dtype, device=device) for v in tensors.values()]
    for s, d in zip(src, dst, strict=True):  # untimed: the first copy sets up the path
        d.copy_(s, non_blocking=True)
    sync(device)
    t = time.perf_counter()
    for _ in range(batches):
        for s, d in zip(src, dst, strict=True):
            d.copy_(s, non_blocking=True)
    sync(device)
    return batches * len(sample[ID_FIELD]) / (time.perf_counter() - t)


def model_and_optimizer(spec: FeatureSpec, hidden: int, config: ReferenceConfig, device):
    """As the reference trainer builds them: initialised on the CPU from the seed, then moved."""
    torch.manual_seed(config.seed)
    model = MLP(spec.dim, hidden, spec.outputs).to(device)
    return model, torch.optim.Adam(model.parameters(), lr=config.learning_rate)


def host_waits(model, opt, sample: dict, spec: FeatureSpec, config, index: Index, device):
    """Where one reference step makes the host wait for the GPU (CUDA's sync debug mode): each
    such wait drains the queue, so the next batch's host work cannot overlap this step's."""
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            tensors = fit_tensors(sample, spec=spec, config=config, index=index, device=device)
            train_step(model, opt, tensors[X], tensors[Y], tensors[WEIGHT], sums, config)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sync(device)  # the step's own work, not the next measurement's
    return [
        f"{Path(c.filename).name}:{c.lineno}"
        for c in caught
        if "synchroniz" in str(c.message).lower()
    ]


def compute_seconds(
    model, opt, resident: dict, y, w, spec: FeatureSpec, steps: int, config, device
) -> float:
    """Seconds for ``steps`` steps on a batch already on the device: the GPU's own work per
    step (the normalisation in ``to_features`` included), with no reader to wait for."""
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        train_step(model, opt, to_features(resident, spec), y, w, sums, config)
    sync(device)
    return time.perf_counter() - t


def train_epoch(
    loader: ReaderLoader, index: Index, spec: FeatureSpec, model, opt, config, device
) -> tuple[float, int, float, Tally]:
    """One epoch of the reference loop, every batch tallied: seconds, steps, mean loss, tally."""
    tally = Tally(index.id_field, label="bench")
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    steps = 0
    sync(device)
    t = time.perf_counter()
    for batch in loader:
        tally.update(batch)
        tensors = batch_tensors(batch, spec, config, index, device)  # as the fit takes them
        train_step(model, opt, tensors[X], tensors[Y], tensors[WEIGHT], sums, config)
        steps += 1
    sync(device)
    seconds = time.perf_counter() - t
    total_loss, total_w = sums.tolist()  # read once an epoch, as the trainer does
    return seconds, steps, total_loss / max(total_w, 1e-8), tally


def idle_check(
    name: str,
    hidden: int,
    loader: ReaderLoader,
    index: Index,
    spec: FeatureSpec,
    sample: dict,
    config: ReferenceConfig,
    device: torch.device,
    epoch: int,
) -> tuple[float, ReconcileReport, list[str] | None]:
    """One training epoch of the model of width ``hidden`` against its compute-only limit;
    prints both and returns the idle fraction, the epoch's reconciliation and (CUDA) where a
    step makes the host wait for the GPU."""
    model, opt = model_and_optimizer(spec, hidden, config, device)
    # the sample's masks are host work built once: the limit is the device's share of a step
    tensors = fit_tensors(sample, spec=spec, config=config, index=index, device=device)
    y, w = tensors[Y], tensors[WEIGHT]
    resident = to_device(sample, device)
    steps = len(loader)
    compute_seconds(model, opt, resident, y, w, spec, WARMUP_STEPS, config, device)
    waits = None
    if device.type == "cuda":
        waits = host_waits(model, opt, sample, spec, config, index, device)
    before = compute_seconds(model, opt, resident, y, w, spec, steps, config, device)
    loader.set_epoch(epoch)
    seconds, done, loss, tally = train_epoch(loader, index, spec, model, opt, config, device)
    after = compute_seconds(model, opt, resident, y, w, spec, steps, config, device)
    compute = min(before, after)
    idle = max(0.0, 1.0 - compute / seconds)
    report = reconcile(index.manifest, [tally.counts], ids=index.ids, raise_on_mismatch=False)
    print(
        f"{name} (hidden {hidden}): epoch {seconds:.2f} s for {done} steps "
        f"({report.items_iterated / seconds:,.0f} rows/s, loss {loss:.4f}); compute alone "
        f"{compute:.2f} s (before {before:.2f}, after {after:.2f}); idle {idle:.0%}",
        flush=True,
    )
    if waits is not None:
        print(f"  host waits for the GPU {len(waits)}x per step: {', '.join(waits) or '-'}")
    return idle, report, waits


def describe(report: ReconcileReport) -> str:
    """The reconciliation in one phrase: iterated/expected, duplicates, missing, statuses."""
    statuses = "match" if report.by_status_found == report.by_status_expected else "DIFFER"
    return (
        f"{report.items_iterated:,}/{report.items_expected:,} {report.duplicates} dup "
        f"{report.missing} missing, statuses {statuses}"
    )


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Parse the options, choose the device (or say there is no CUDA) and run in a staging dir."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allow-cpu", action="store_true", help="without CUDA, measure on the CPU")
    ap.add_argument("--items", type=int, help=f"rows (default {CUDA_ITEMS:,}, CPU {CPU_ITEMS:,})")
    ap.add_argument(
        "--workers",
        type=int,
        default=min(8, max(1, (os.cpu_count() or 2) // 2)),
        help="DataLoader workers (default: half the cores, at most 8)",
    )
    ap.add_argument("--batch-size", type=int, default=4096, help="rows per step (default 4096)")
    ap.add_argument("--out", type=Path, help="stage here and keep it (default: a temp dir)")
    args = ap.parse_args(argv)

    device = choose_device("auto")
    if device.type != "cuda" and not args.allow_cpu:
        print(
            f"gpu: no CUDA device visible to torch {torch.__version__}; nothing measured "
            "(--allow-cpu runs the same checks on the CPU)"
        )
        return 0
    items = args.items or (CUDA_ITEMS if device.type == "cuda" else CPU_ITEMS)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (--allow-cpu)"
    print(
        f"device {device}: {what}; {items:,} items, batch {args.batch_size}, "
        f"{args.workers} workers, torch {torch.__version__}",
        flush=True,
    )
    out = args.out or Path(tempfile.mkdtemp(prefix="lithi-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        return run(out, items, args.batch_size, args.workers, device, t0)
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


def run(out: Path, items: int, batch_size: int, workers: int, device, t0: float) -> int:
    """Stage, fit the spec, measure the three checks and print the summary; 1 if unreconciled."""
    index = bundle(out, items)
    config = ReferenceConfig(features=[FEATURE], batch_size=batch_size)
    fields, _ = config.choose_features(index.schema, index.id_field)
    loader = make_loader(
        index,
        style="map",
        batch_size=batch_size,
        num_workers=workers,
        shuffle=True,
        seed=config.seed,
        pin_memory=wants_pinned_memory(device),
    )
    # Epoch 0 is the fitting pass, as in the reference trainer: it also decodes every part once
    # (the cold epoch), so the epochs measured below read warm, as a trainer's later epochs do.
    keep: list[dict] = []
    loader.set_epoch(0)
    t = time.perf_counter()
    spec = fit_spec(
        first_kept(loader, keep),
        fields,
        task=config.task,
        label=config.label,
        has_status=index.is_result,
    )
    print(f"fitting pass (cold): {len(index) / (time.perf_counter() - t):,.0f} rows/s", flush=True)
    sample = keep[0]
    batches = len(loader)

    # 1. host to device, against the raw pinned copy of the same tensors
    first = pinned_copy_rate(sample, batches, device)
    loader.set_epoch(1)
    rows, seconds = loader_h2d(loader, device)
    limit = max(first, pinned_copy_rate(sample, batches, device))
    h2d = rows / seconds
    row_bytes = sum(
        v.element_size() * v[0].numel() for v in sample.values() if isinstance(v, torch.Tensor)
    )
    print(
        f"host to device: loader {h2d:,.0f} rows/s, pinned copy_ {limit:,.0f} rows/s "
        f"({limit * row_bytes / 1e9:.1f} GB/s at {row_bytes} B/row): {h2d / limit:.2f}x",
        flush=True,
    )

    # 2. and 3. idle fraction per model, each epoch reconciled; with workers, they derive each
    # batch's tensors, as they do for the reference trainer
    if workers > 0:
        loader.set_derive(functools.partial(fit_tensors, spec=spec, config=config, index=index))
    idle_mlp, rec_mlp, waits = idle_check(
        "mlp", HIDDEN, loader, index, spec, sample, config, device, 2
    )
    idle_wide, rec_wide, _ = idle_check(
        "wide", WIDE, loader, index, spec, sample, config, device, 3
    )
    for name, rep in (("mlp", rec_mlp), ("wide", rec_wide)):
        print(f"reconciled {name} epoch: {describe(rep)}", flush=True)
        for problem in rep.problems():
            print(f"  {problem}")
    ok = rec_mlp.ok and rec_wide.ok
    if device.type == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**20:,.0f} MiB")
    dev = "gpu" if device.type == "cuda" else "cpu"
    worst = rec_mlp if not rec_mlp.ok else rec_wide
    print(
        f"{dev}: h2d {h2d / limit:.2f}x of pinned copy_ ({h2d:,.0f} rows/s vs {limit:,.0f}); "
        f"idle mlp {idle_mlp:.0%} wide {idle_wide:.0%}; reconciled "
        f"{worst.items_iterated}/{worst.items_expected} {worst.duplicates} dup "
        f"{worst.missing} missing{'' if ok else ' FAILED'}"
        + ("" if waits is None else f"; {len(waits)} host waits/step")
        + f"; {time.perf_counter() - t0:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
