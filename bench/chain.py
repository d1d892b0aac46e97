"""The whole chain at scale, step by step, each step beside its physical limit measured in the run.

For every ``--items N`` it stages the synthetic sample (``pipeline.defs.samples``), labels it on
the local Compute (the linear-cost centroid labeller), then materializes each chain asset in turn
on a persisted SQLite instance, once per ``--world-sizes`` value (1: training in the step's
process; 2: two real torchrun ranks through Dagster Pipes, as the chain does it), each rank with
a DataLoader worker per core it does not compute on (``workers_per_rank``). Every step runs in a
fresh child process, so its peak RSS is its own (sampled from ``/proc`` by the bench's process
for the child and its descendants, the torchrun ranks and DataLoader workers, until the step
ends: see ``TreeMemory``); bytes hashed come from
``file_bytes_hashed()`` in that process (plus what the torchrun ranks report through Pipes).

Limits are rates measured in this same run, on this same bundle, after the steps (page cache
warm, as the steps found it), each the best of three tries:

* ``sha256``: the project's parallel file hashing (two threads here) over the result parts;
* ``decode``: ``pq.read_table`` of every column of the result parts, and the id column alone
  read from every part side by side, a thread a core (as ``Index.from_snapshot`` reads it),
  and the columns verify decodes (the ids and a result's statuses) with ``pq.read_table`` over
  every part;
* ``unique ids``: ``pipeline.bundle.ids.duplicates`` over the ids already in memory (verify's
  check that no id occurs twice);
* ``write``: ``pq.write_table`` of the result rows (the staging writer's codec and row groups);
* ``write ids``: saving the id column as ``disjoint_index`` saves its index (``index.parquet``,
  zstd, written atomically);
* ``loader``: the iterable reader (the one prediction uses) in the process, with the training
  batch size and no model;
* ``durable copy``: the parts copied into a folder of the bench's file system, each file
  fsynced, as the bundle cache brings a file in. ``verified_snapshot`` copies the whole bundle
  once (a disk can take a burst of a few hundred MB far faster than it sustains gigabytes);
  the other steps, which copy nothing, time the sample.

Each step starts after ``os.sync()``: the disk is not still writing the step before's output.

A step's limit is the time those would take for the work the step must do (e.g. verify: hash
every byte + decode the ids). ``x limit`` is wall / limit (1.0 = at the limit). With several
``--items`` values each step's exponent is the slope of log(wall) against log(items).

Training and prediction also run a model, which no reader removes: after those steps the trained
checkpoint is timed alone on one batch already in memory (a training step: forward, loss,
backward, Adam; a prediction: forward, softmax; ``model_rates``). ``model s`` is that arithmetic
for the step's rows (each epoch's training steps and the evaluation forward; one forward per
predicted item), and ``x (limit + model)`` is wall / (limit + model s): how far the step is from
its data and its model together. Training's floor (``training_floor``) is the least the step
could take with its data and its model overlapped perfectly, printed beside the table.

    .venv/bin/python bench/chain.py [--items 20000 ...] [--world-sizes 1 2] [--epochs 1]

Results print as a table and go to ``bench/out/chain-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

OUT = ROOT / "bench" / "out"
STEPS = (
    "result_manifest",
    "verified_snapshot",
    "disjoint_index",
    "training_run",
    "prediction_table",
    "output_bundle",
)
#: Limits are rates, measured by every step's own process right after the step (same load, same
#: page cache) on at most this many rows of the bundle it worked on.
LIMIT_SAMPLE_ROWS = 1 << 18
DAGSTER_YAML = "telemetry:\n  enabled: false\n"
#: names the file a child creates when its step is done (``TreeMemory`` stops sampling there)
STEP_DONE_ENV = "BENCH_STEP_DONE"


# -- children: one step each, reporting what it cost ---------------------------------------------


class TreeMemory:
    """Peak memory of process ``root`` and every descendant (torchrun ranks, DataLoader
    workers), sampled from /proc by the bench's own process: a sampler thread inside the
    measured process would take the GIL from the step it measures.

    ``ru_maxrss`` cannot be used: Linux carries a parent's high-water mark into a forked child,
    so a child of a large process reports the parent's peak. Each process's own peak
    (``VmHWM``) is read while it lives, and ``RssAnon`` (heap, not file pages) is sampled every
    50 ms: memory-mapped Parquet parts count in RSS as page cache the kernel can drop, so the
    anonymous share is reported beside the total.
    """

    def __init__(self, root: int, done: Path) -> None:
        self.root = root
        self.done = done  # the child creates it when its step ends: its limits are not the step
        self.peak_rss = 0.0  # MiB: the largest VmHWM of any one process of the tree
        self.peak_anon = 0.0  # MiB: the largest sampled RssAnon of any one process
        self.peak_tree_anon = 0.0  # MiB: the largest sampled sum of RssAnon over the tree
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            if self.done.exists():
                return
            self.sample()

    def sample(self) -> None:
        """Read the tree's memory once."""
        tree_anon = 0.0
        for pid in _tree(self.root):
            status = _status(pid)
            self.peak_rss = max(self.peak_rss, status.get("VmHWM", 0.0))
            anon = status.get("RssAnon", 0.0)
            self.peak_anon = max(self.peak_anon, anon)
            tree_anon += anon
        self.peak_tree_anon = max(self.peak_tree_anon, tree_anon)


def _status(pid: int) -> dict[str, float]:
    """The ``kB`` fields of /proc/PID/status, in MiB (empty if the process is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                out[key] = int(value.split()[0]) / 1024
    except (OSError, ValueError):
        pass
    return out


def _tree(root: int) -> list[int]:
    """``root`` and its living descendants, from the parent pid of every process in /proc."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parents[int(d.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError):
                continue
    tree, frontier = [root], [root]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        tree += kids
        frontier = kids
    return tree


def child_stage(work: Path, items: int) -> dict:
    """Stage the synthetic input (and its bounded reference) under ``work/home``."""
    from pipeline.bundle.digest import file_bytes_hashed
    from pipeline.defs.samples import stage_synthetic

    t = time.perf_counter()
    inp, ref = stage_synthetic(items, work / "home" / "inputs")
    wall = time.perf_counter() - t
    staged = {"input": str(inp.root), "reference": str(ref.root)}
    (work / "staged.json").write_text(json.dumps(staged))
    return {
        "wall": wall,
        "hashed": file_bytes_hashed(),
        "rows": items,
        "bytes_written": inp.stats.bytes_total,
        "input": str(inp.root),
    }


def child_label(work: Path, items: int) -> dict:
    """Label the staged input on the local Compute (inline: this process is the worker)."""
    from pipeline.bundle.digest import file_bytes_hashed
    from pipeline.bundle.verify import verify
    from pipeline.defs.samples import SYNTHETIC_ROWS_PER_PART
    from resources.compute.client import JobSpec
    from resources.compute.local import LocalCompute

    home = work / "home"
    staged = json.loads((work / "staged.json").read_text())
    inp, ref = staged["input"], staged["reference"]
    compute = LocalCompute(home / "compute", "inline")
    before = file_bytes_hashed()
    t = time.perf_counter()
    job = compute.submit(
        JobSpec(
            input_url=str(inp),
            reference_url=str(ref),
            job_id="bench",
            labeller="centroid",
            rows_per_part=SYNTHETIC_ROWS_PER_PART,
        )
    )
    status = compute.status(job)
    wall = time.perf_counter() - t
    if status.state != "SUCCEEDED":
        raise SystemExit(f"labelling ended {status.state}: {status.message}")
    result = Path(compute.manifest_url(job))
    snap = verify(result, trusted=lambda *_: True)
    staged = json.loads((work / "staged.json").read_text())
    (work / "staged.json").write_text(json.dumps({**staged, "result": str(result)}))
    return {
        "wall": wall,
        "hashed": file_bytes_hashed() - before,
        "rows": items,
        "bytes_written": snap.stats.bytes_total,
        "result": str(result),
        "job_id": job,
    }


def workers_per_rank(world: int, cores: int | None = None) -> int:
    """DataLoader workers per rank: each rank's share of the cores less the one it computes on
    (on two cores: one worker at world size 1, none at 2, where the ranks fill the cores)."""
    from pipeline.bundle.digest import cpu_count

    cores = cores or cpu_count()
    return max(0, cores // world - 1)


def child_asset(work: Path, step: str, world: int, epochs: int, batch_size: int) -> dict:
    """Materialize one chain asset on the persisted instance (upstream loaded by the IO manager)."""
    import dagster as dg

    from assets import CHAIN_ASSETS
    from assets.training_run import TrainingConfig
    from pipeline.bundle.digest import file_bytes_hashed
    from pipeline.defs.definitions import resources_from
    from resources.settings import LithiEnv

    home = work / "home"
    dagster_home = work / f"dagster-ws{world}"
    env = LithiEnv(
        home=work / f"chain-ws{world}",
        compute_root=home / "compute",
        compute_executor="inline",
        job_id="bench",
        world_size=world,
        num_workers=workers_per_rank(world),
    )
    resources = resources_from(env)
    # The iterable reader: its memory is one row group per consumer; the map-style reader keeps
    # every part its shuffled share touches decoded (the whole bundle at world size 1).
    training = TrainingConfig(
        epochs=epochs, batch_size=batch_size, features=["embedding"], reader="iterable"
    )
    config = dg.RunConfig(ops={"training_run": training} if step == "training_run" else {})
    selection = ["compute_versions", step] if step == "result_manifest" else [step]
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        before = file_bytes_hashed()
        t = time.perf_counter()
        result = dg.materialize(
            CHAIN_ASSETS,
            selection=selection,
            resources=resources,
            run_config=config,
            instance=instance,
        )
        wall = time.perf_counter() - t
        if not result.success:
            raise SystemExit(f"{step} failed")
        step_times = _step_seconds(instance, result.run_id)
    meta = {
        k: getattr(v, "value", v)
        for k, v in result.asset_materializations_for_node(step)[0].metadata.items()
    }
    out = {
        "wall": wall,
        "step_wall": step_times.get(step, wall),
        "hashed": file_bytes_hashed() - before + int(meta.get("pipes/ranks_bytes_hashed", 0)),
    }
    if step == "training_run":
        from pipeline.training.record import read_record
        from pipeline.training.threads import intra_op_threads

        record = read_record(meta["record"])
        checkpoint = Path(meta["checkpoint"]) / "model.pt"
        bundle = Path(json.loads((work / "staged.json").read_text())["result"])
        out.update(
            passes=record.passes,
            epochs=epochs,
            holdout_accuracy=record.metrics.get("holdout_accuracy"),
            reconciled=record.reconciliation.ok,
            # at the intra-op threads the fit gives a rank with its workers
            **model_rates(
                checkpoint,
                batch_size,
                threads=intra_op_threads(world, workers_per_rank(world)),
                beside=bundle if world == 1 else None,
            ),
        )
        if world > 1:
            from model_floor import ranks_rows_per_s

            out["model_ranks_rows_per_s"] = ranks_rows_per_s(checkpoint, batch_size, world)
    if step == "prediction_table":
        from pipeline.training.predict import BATCH_ROWS

        ckpt = _latest_checkpoint(work / f"chain-ws{world}")
        out.update(model_rates(ckpt, BATCH_ROWS["cpu"]))
    if step == "output_bundle":
        out["bytes_written"] = meta.get("bundle/bytes") or 0
    if step == "verified_snapshot":
        out["bytes_copied"] = meta.get("bytes_downloaded") or 0  # into the cache
    return out


def model_rates(
    checkpoint: Path,
    batch_size: int,
    steps: int = 200,
    *,
    threads: int | None = None,
    beside: Path | None = None,
) -> dict[str, float]:
    """Rows per second of the trained model alone, on one batch already in memory: a training
    step (forward, loss, backward, Adam) and a prediction (forward, softmax). The model's own
    arithmetic, which no reader or pipeline can remove: what a step costs beyond its data.
    ``threads``: torch's intra-op threads meanwhile (default: as they are), the fit's own.

    With ``beside`` (a bundle), the training step is timed again while a loader pass over it
    runs in another process (``model_train_beside_reading_rows_per_s``; see
    ``bench/model_floor.py``)."""
    import torch
    from model_floor import best_seconds, reading_beside, train_step

    from pipeline.training.denormals import flushed_denormals
    from pipeline.training.model import load_checkpoint
    from pipeline.training.threads import torch_threads

    model, spec = load_checkpoint(checkpoint)
    x = torch.randn(batch_size, spec.dim)

    def predict_step() -> None:
        with torch.no_grad():
            torch.softmax(model.net(x), dim=1).max(dim=1)

    train = train_step(model, spec, batch_size)
    rates = {}
    # as the fit computes (its default flush_denormals): a trained model's denormal weights
    # would otherwise slow this and overstate what the model costs
    with flushed_denormals(), torch_threads(threads or torch.get_num_threads()):
        for name, fn in (
            ("model_train_rows_per_s", train),
            ("model_predict_rows_per_s", predict_step),
        ):
            rates[name] = steps * batch_size / best_seconds(fn, steps)
        if beside is not None:
            with reading_beside(beside, batch_size):
                seconds = best_seconds(train, steps)
            rates["model_train_beside_reading_rows_per_s"] = steps * batch_size / seconds
    return rates


def _latest_checkpoint(artifacts_home: Path) -> Path:
    """The checkpoint of the newest training run under a world size's artifacts."""
    found = sorted(artifacts_home.glob("artifacts/training_run/*/checkpoint/model.pt"),
                   key=lambda p: p.stat().st_mtime)  # fmt: skip
    if not found:
        raise SystemExit(f"no checkpoint under {artifacts_home}")
    return found[-1]


def _step_seconds(instance, run_id: str) -> dict[str, float]:
    """Each step's own wall time, from its STEP_START and STEP_SUCCESS events."""
    import dagster as dg

    start, end = {}, {}
    for e in instance.all_logs(run_id):
        if e.dagster_event is None:
            continue
        kind = e.dagster_event.event_type
        if kind == dg.DagsterEventType.STEP_START:
            start[e.step_key] = e.timestamp
        elif kind == dg.DagsterEventType.STEP_SUCCESS:
            end[e.step_key] = e.timestamp
    return {k: end[k] - start[k] for k in end if k in start}


def run_child(args: list[str]) -> dict:
    """Run ``bench/chain.py --child ...`` in a fresh process; its JSON plus its peak RSS."""
    # One torch thread per rank, in process too (LITHI_TORCH_THREADS; the step's own default is
    # its share of the cores): the figures stay comparable with earlier rounds, and on two cores
    # shared with other work a second thread only contends (docs/performance.md).
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "LITHI_TORCH_THREADS": "1",
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    # The step before may leave gigabytes of written pages for the kernel to flush; a step that
    # writes to the disk itself (the cache copy, with its fsyncs) would otherwise wait on that
    # writeback and be charged for the step before it.
    os.sync()
    with (
        tempfile.TemporaryDirectory() as scratch,
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        done = Path(scratch) / "step-done"
        env[STEP_DONE_ENV] = str(done)
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=err, text=True)
        with TreeMemory(proc.pid, done) as mem:
            returncode = proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result.update(
        peak_rss_mib=mem.peak_rss, peak_anon_mib=mem.peak_anon, tree_anon_mib=mem.peak_tree_anon
    )
    return result


def child_main(argv: list[str]) -> int:
    """Entry point of a child: run one step, print one JSON line with its costs."""
    p = argparse.ArgumentParser()
    p.add_argument("what")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--items", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=1024)
    a = p.parse_args(argv)
    if a.what == "stage":
        out = child_stage(a.work, a.items)
    elif a.what == "label":
        out = child_label(a.work, a.items)
    else:
        out = child_asset(a.work, a.what, a.world, a.epochs, a.batch_size)
    Path(os.environ[STEP_DONE_ENV]).touch()  # the memory the step held is measured up to here
    staged = json.loads((a.work / "staged.json").read_text())
    bundle = staged["input"] if a.what == "stage" else staged["result"]
    # the cache copy's limit at the size the step copied: a disk may take a burst of a few
    # hundred MB far faster than it sustains gigabytes
    whole = a.what == "verified_snapshot"
    out["limits"] = measure_limits(Path(bundle), a.batch_size, copy_whole=whole)
    print(json.dumps(out))
    return 0


# -- limits: rates measured in the same run ------------------------------------------------------


def measure_limits(
    result_root: Path, batch_size: int, *, copy_whole: bool = False
) -> dict[str, float]:
    """sha256, decode and write rates over (a bounded prefix of) the result bundle's parts; the
    durable copy over the same prefix, or once over every part with ``copy_whole``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.bundle.digest import cpu_count, sha256_files
    from pipeline.bundle.ids import duplicates
    from pipeline.bundle.verify import verify
    from pipeline.readers.index import Index, read_columns
    from pipeline.readers.loader import make_loader

    snap = verify(result_root)
    paths, rows = [], 0
    for entry, path in zip(snap.manifest.parts, snap.part_paths(), strict=True):
        if rows >= LIMIT_SAMPLE_ROWS:
            break
        paths.append(path)
        rows += entry.rows
    nbytes = sum(p.stat().st_size for p in paths)
    id_field = snap.manifest.item_id_field

    def best(fn, repeat: int = 3) -> float:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    sha = best(lambda: sha256_files(paths))
    decode_all = best(lambda: [pq.read_table(p) for p in paths])
    decode_ids = best(lambda: read_columns(paths, id_field))
    checked = _checked_columns(snap.manifest)
    decode_checked = best(lambda: pq.read_table(paths, columns=checked))
    id_column = pa.chunked_array(
        [c for col in read_columns(paths, id_field) for c in col.chunks], type=pa.string()
    )
    unique = best(lambda: duplicates([id_column]))
    write = _write_seconds(pa.concat_tables(pq.read_table(p) for p in paths), best)
    write_ids = best(lambda: _save_ids(id_column.combine_chunks()))
    if copy_whole:
        every = snap.part_paths()
        os.sync()  # what the step wrote is not this copy's to flush
        copy_bytes_per_s = sum(p.stat().st_size for p in every) / best(
            lambda: _copy_durably(every), repeat=1
        )
    else:
        copy_bytes_per_s = nbytes / best(lambda: _copy_durably(paths))
    index = Index.from_snapshot(snap)
    loader = make_loader(
        index, style="iterable", batch_size=batch_size, num_workers=0, shuffle=True
    )

    seen = 0

    def load_sample() -> None:
        nonlocal seen
        seen = 0
        for batch in loader:
            seen += len(batch[id_field])
            if seen >= LIMIT_SAMPLE_ROWS:
                break

    load = best(load_sample)  # the best of three, as every other rate here
    return {
        "threads": cpu_count(),
        "sha256_bytes_per_s": nbytes / sha,
        "bytes_per_row": nbytes / rows,
        "decode_rows_per_s": rows / decode_all,
        "decode_id_rows_per_s": rows / decode_ids,
        "decode_checked_rows_per_s": rows / decode_checked,
        "unique_rows_per_s": rows / unique,
        "write_rows_per_s": rows / write,
        "write_id_rows_per_s": rows / write_ids,
        "copy_bytes_per_s": copy_bytes_per_s,
        "loader_rows_per_s": seen / load,
        "sample_rows": rows,
    }


def _checked_columns(manifest) -> list[str]:
    """The columns verify decodes: the ids, and a result bundle's statuses (counted against the
    manifest's counts by status)."""
    from pipeline.bundle import format as fmt

    extra = [fmt.STATUS_COLUMN] if manifest.kind == "result" else []
    return [manifest.item_id_field, *extra]


def _write_seconds(table, best) -> float:
    """Best time to write ``table`` as Parquet with the staging writer's row groups."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        target = Path(tmp) / "w.parquet"
        return best(lambda: pq.write_table(table, target, row_group_size=65_536))


def _save_ids(ids) -> None:
    """Write ``ids`` as ``Index.save`` writes an index: one zstd Parquet column, atomically."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.bundle.atomic import atomic_write_bytes

    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": ids}), buf, compression="zstd")
        atomic_write_bytes(Path(tmp) / "index.parquet", buf.getvalue())


def _copy_durably(paths: list[Path]) -> None:
    """Copy ``paths`` into one folder of the bench's file system, each file flushed to the disk
    before the next (as the bundle cache brings a file in: written, then fsynced)."""
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        for p in paths:
            target = Path(tmp) / p.name
            shutil.copyfile(p, target)
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def limit_seconds(step: str, items: int, m: dict, lim: dict, input_bytes: int) -> float:
    """The time the step's unavoidable work takes at the measured rates."""
    hashed = m.get("hashed", 0)
    sha = hashed / lim["sha256_bytes_per_s"]
    ids = items / lim["decode_id_rows_per_s"]
    rows = items / lim["decode_rows_per_s"]
    write = items / lim["write_rows_per_s"]
    if step == "stage":
        return write + input_bytes / lim["sha256_bytes_per_s"]
    if step == "label":
        return rows + write + sha + m["bytes_written"] / lim["sha256_bytes_per_s"]
    if step == "result_manifest":
        return 0.0  # reads one JSON file: no data-sized work
    if step == "verified_snapshot":
        # hash every byte; decode the ids (and a result's statuses) and find none twice; copy
        # into the cache what is not linked, at the disk's durable rate
        checked = items / lim.get("decode_checked_rows_per_s", lim["decode_id_rows_per_s"])
        unique = items / lim.get("unique_rows_per_s", math.inf)
        return sha + checked + unique + m.get("bytes_copied", 0) / lim["copy_bytes_per_s"]
    if step == "disjoint_index":  # decode the ids, save them as the index
        return ids + items / lim.get("write_id_rows_per_s", math.inf) + sha
    if step == "training_run":
        return m["passes"] * items / lim["loader_rows_per_s"] + sha
    if step == "prediction_table":
        return rows + write
    if step == "output_bundle":
        return write + sha
    raise KeyError(step)


def model_seconds(step: str, items: int, m: dict) -> float | None:
    """The model's own arithmetic in a step, at the rates measured beside it (None where a step
    runs no model): each epoch's training steps and the evaluation pass's forward for
    ``training_run``, one forward per item for ``prediction_table``."""
    if step == "training_run" and "model_train_rows_per_s" in m:
        epochs = m.get("epochs", 1)
        return epochs * items / m["model_train_rows_per_s"] + items / m["model_predict_rows_per_s"]
    if step == "prediction_table" and "model_predict_rows_per_s" in m:
        return items / m["model_predict_rows_per_s"]
    return None


def training_floor(items: int, m: dict, lim: dict, world: int = 1) -> float | None:
    """The least a training step could take on this machine, every core busy where it can be.

    * The fitting pass reads on every core: no model runs until it has found the features.
    * Each epoch takes the longer of its reading and its training steps. At world size 1 the
      steps are timed beside a reader in another process, as the fit's DataLoader worker reads
      beside them, and the reading has the cores the steps leave. At world size 2 or more the
      ranks' steps are timed together under DDP (gradients all-reduced over gloo) and the
      reading is counted as if it hid in the all-reduce's waits, on every core.
    * The evaluation reads and scores on every core.

    Each figure was measured on a batch in memory or a loader pass alone; the floor counts no
    launch, no imports, no receiving of batches and no tally. None where no model was timed.
    """
    if "model_train_rows_per_s" not in m:
        return None
    cores = max(1, lim.get("threads", 1))
    data_pass = items / lim["loader_rows_per_s"]
    predict = items / m["model_predict_rows_per_s"]
    if world > 1 and "model_ranks_rows_per_s" in m:
        epoch = max(data_pass / cores, items / m["model_ranks_rows_per_s"])
    else:
        train_rate = m.get("model_train_beside_reading_rows_per_s", m["model_train_rows_per_s"])
        epoch = max(data_pass / max(1, cores - 1), items / train_rate)
    return data_pass / cores + m.get("epochs", 1) * epoch + (data_pass + predict) / cores


def main(argv: list[str] | None = None) -> int:
    """Run the chain at each size and world size, print the table, save the JSON."""
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, nargs="+", default=[20_000], help="sizes (default 20000)")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--epochs", type=int, default=1, help="training epochs (default 1)")
    ap.add_argument("--batch-size", type=int, default=1024, help="training batch (default 1024)")
    ap.add_argument("--keep", action="store_true", help="keep the bundles under bench/out")
    args = ap.parse_args(argv)

    OUT.mkdir(parents=True, exist_ok=True)
    results: dict = {"args": vars(args), "runs": []}
    path = OUT / f"chain-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    for items in args.items:
        work = OUT / f"chain-{items}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for ws in args.world_sizes:
            (work / f"dagster-ws{ws}").mkdir()
            (work / f"dagster-ws{ws}" / "dagster.yaml").write_text(DAGSTER_YAML)
        common = ["--work", str(work), "--items", str(items)]
        steps = {"stage": run_child(["stage", *common])}
        print(
            f"{items:,} items: staged in {steps['stage']['wall']:.1f}s", file=sys.stderr, flush=True
        )
        steps["label"] = run_child(["label", *common])
        print(f"  labelled in {steps['label']['wall']:.1f}s", file=sys.stderr)
        by_world = {}
        for ws in args.world_sizes:
            by_world[ws] = {}
            for step in STEPS:
                extra = ["--world", str(ws), "--epochs", str(args.epochs)]
                extra += ["--batch-size", str(args.batch_size)]
                by_world[ws][step] = run_child([step, *common, *extra])
                print(
                    f"  ws{ws} {step}: {by_world[ws][step]['step_wall']:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
        results["runs"].append({"items": items, "steps": steps, "by_world": by_world})
        path.write_text(json.dumps(results, indent=2))  # after every size: a long run keeps each
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    print(f"\nraw results: {path.relative_to(ROOT)}")
    return 0


def rows_for(results: dict):
    """(items, world, step, measured, limit seconds) for every measured step."""
    for run in results["runs"]:
        items = run["items"]
        input_bytes = run["steps"]["stage"]["bytes_written"]
        for step in ("stage", "label"):
            m = run["steps"][step]
            yield items, "-", step, m, limit_seconds(step, items, m, m["limits"], input_bytes)
        for ws, steps in run["by_world"].items():
            for step, m in steps.items():
                yield items, ws, step, m, limit_seconds(step, items, m, m["limits"], input_bytes)


def exponents(
    results: dict, *, largest_two: bool = False, of_ratio: bool = False
) -> dict[tuple, float]:
    """Slope of log(step wall) against log(items), per (world, step), over every size run.

    ``largest_two``: only between the two largest sizes, the slope the scale target names (a
    start-up cost at a small size would pull the slope over every size down). ``of_ratio``:
    the slope of wall / limit instead, which holds still when the machine's own rates change
    between sizes, as they do on a shared machine.
    """
    series: dict[tuple, list[tuple[float, float]]] = {}
    for items, ws, step, m, lim_s in rows_for(results):
        wall = m.get("step_wall", m["wall"])
        if of_ratio:
            wall = wall / lim_s if lim_s > 0 else 0.0
        if wall > 0:
            series.setdefault((str(ws), step), []).append((math.log(items), math.log(wall)))
    out = {}
    for key, pts in series.items():
        if largest_two:
            pts = sorted(pts)[-2:]
        if len({x for x, _ in pts}) < 2:
            continue
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        out[key] = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return out


def print_table(results: dict) -> None:
    """The per-step table (markdown), then the limits and the exponents."""
    print(
        "| items | ws | step | wall s | limit s | x limit | hashed MB | rows decoded "
        "| peak RSS MiB | peak anon MiB | model s | x (limit + model) |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for items, ws, step, m, lim_s in rows_for(results):
        wall = m.get("step_wall", m["wall"])
        ratio = f"{wall / lim_s:.2f}" if lim_s > 0 else "-"
        decoded = _rows_decoded(step, items, m)
        model = model_seconds(step, items, m)
        with_model = "-" if model is None else f"{model:.2f} | {wall / (lim_s + model):.2f}"
        print(
            f"| {items:,} | {ws} | {step} | {wall:.2f} | {lim_s:.2f} | {ratio} | "
            f"{m.get('hashed', 0) / 1e6:.0f} | {decoded:,} | {m['peak_rss_mib']:.0f} | "
            f"{m['peak_anon_mib']:.0f} | {with_model if model is not None else '- | -'} |"
        )
    for run in results["runs"]:
        lim = run["steps"]["label"]["limits"]
        print(
            f"\nlimits measured after labelling {run['items']:,} items "
            f"({lim['sample_rows']:,} rows sampled; every step measures its own): sha256 x"
            f"{lim['threads']} {lim['sha256_bytes_per_s'] / 1e6:.0f} MB/s; decode "
            f"{lim['decode_rows_per_s'] / 1e6:.2f} M rows/s (ids only "
            f"{lim['decode_id_rows_per_s'] / 1e6:.2f}, with statuses "
            f"{lim.get('decode_checked_rows_per_s', math.nan) / 1e6:.2f}); unique ids "
            f"{lim.get('unique_rows_per_s', math.nan) / 1e6:.2f} M rows/s; write "
            f"{lim['write_rows_per_s'] / 1e6:.2f} "
            f"M rows/s (ids only {lim.get('write_id_rows_per_s', math.nan) / 1e6:.2f}); "
            f"loader {lim['loader_rows_per_s'] / 1e6:.2f} M rows/s; durable copy "
            f"{lim['copy_bytes_per_s'] / 1e6:.0f} MB/s"
        )
    floors = [
        (items, ws, m, lim_s, training_floor(items, m, m["limits"], int(ws)))
        for items, ws, step, m, lim_s in rows_for(results)
        if step == "training_run"
    ]
    for items, ws, m, lim_s, floor in floors:
        if floor is not None and lim_s > 0:
            print(
                f"\ntraining_run at {items:,}, ws {ws}: its floor on this machine (every core "
                f"busy, see training_floor) {floor:.2f} s = {floor / lim_s:.2f}x the loader; "
                f"the step {m.get('step_wall', m['wall']) / floor:.2f}x its floor"
            )
    exps = exponents(results)
    if not exps:
        return
    sizes = sorted({run["items"] for run in results["runs"]})
    top = exponents(results, largest_two=True)
    top_ratio = exponents(results, largest_two=True, of_ratio=True)
    span = f"{sizes[-2]:,} to {sizes[-1]:,}"
    print(
        "\nexponent of wall time against items (log-log slope), over every size, from "
        f"{span}, and of x limit from {span}:"
    )
    for (ws, step), e in sorted(exps.items()):
        r = top_ratio.get((ws, step))
        against = f"{r:6.2f}" if r is not None else "     -"
        print(f"  ws {ws:>2} {step:<18} {e:6.2f} {top[(ws, step)]:6.2f} {against}")


def _rows_decoded(step: str, items: int, m: dict) -> int:
    """Rows the step must decode: ids for verify and index, every pass for training."""
    if step in ("stage", "result_manifest"):
        return 0
    if step == "training_run":
        return m["passes"] * items  # the fitting pass, the epochs, the evaluation
    return items


if __name__ == "__main__":
    sys.exit(main())
