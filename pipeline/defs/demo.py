"""The main job end to end: a Compute job that goes PARTIAL, carried by the real daemon to a chain.

``make demo`` runs this. It stages scikit-learn's handwritten digits (shipped inside the package,
no download) as an input bundle, submits it to the local Compute with 30% of the items lost to a
simulated worker crash, then starts the real ``dagster-daemon`` on the repo's SQLite instance and
waits while the real sensor resubmits the outstanding items and, once the newer manifest lands,
materializes the whole chain. It ends with a summary and exits non-zero if anything failed or did
not reconcile.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from pipeline.bundle.atomic import atomic_write_text
from pipeline.defs import samples
from pipeline.defs.daemon import start_daemon, stop_daemon, wait_for_chain
from pipeline.defs.instance import prepare_instance
from pipeline.defs.jobs import RESUBMIT_JOB_NAME
from pipeline.defs.samples import submit_sample_job
from pipeline.training.record import OutputRecord, read_record
from resources.compute.faults import FaultSpec
from resources.compute.local import LocalCompute
from resources.compute.local.labeller import REFERENCE_LABEL_COLUMN
from resources.settings import REPO_ROOT, LithiEnv, SettingsError


def latest_metadata(instance: dg.DagsterInstance, asset: str, run_id: str) -> dict:
    """The metadata of ``asset``'s materialization in run ``run_id``, as plain values."""
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=20).records
    for r in records:
        if r.run_id == run_id and r.asset_materialization is not None:
            return {k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}
    return {}


def truth_accuracy(sample: str, predictions_path: str) -> tuple[float, int]:
    """Accuracy of the predictions against the sample's true labels, outside the reference set.

    The kNN labeller saw the reference items' true labels, so only the other items measure
    what the whole loop (Compute labels, then training on them) got right.
    """
    if sample == samples.SYNTHETIC:
        return samples.synthetic_truth_accuracy(pq.read_table(predictions_path))
    s = samples.load(sample)
    table = pq.read_table(predictions_path).join(s.truth, s.id_field)
    held = pc.invert(pc.is_in(table[s.id_field], value_set=s.reference[s.id_field]))
    table = table.filter(held)
    right = pc.sum(pc.equal(table["prediction"], table[REFERENCE_LABEL_COLUMN])).as_py() or 0
    return right / max(table.num_rows, 1), table.num_rows


def summarize(
    instance: dg.DagsterInstance, compute: LocalCompute, job_id: str, run, cache: Path
) -> dict:
    """Every version of the job, what was resubmitted, and the final chain's figures."""
    from resources.bundle_store import BundleStore

    store = BundleStore(cache)
    versions = []
    for v in compute.status(job_id).versions:
        m = store.read_manifest(compute.manifest_url(job_id, v))
        versions.append(
            {
                "version_id": v,
                "status": m.job.status if m.job else "?",
                "attempt": m.job.attempt if m.job else 0,
                "parent_version_id": m.job.parent_version_id if m.job else None,
                "content_sha256": m.snapshot.content_sha256,
                "parts": len(m.parts),
                **m.counts.model_dump(),
            }
        )
    resubmits = [
        r.tags.get("lithi/version_id")
        for r in instance.get_runs(
            filters=dg.RunsFilter(job_name=RESUBMIT_JOB_NAME, tags={"lithi/job_id": job_id})
        )
    ]
    training = latest_metadata(instance, "training_run", run.run_id)
    predictions = latest_metadata(instance, "prediction_table", run.run_id)
    output = latest_metadata(instance, "output_bundle", run.run_id)
    record = read_record(training["record"]) if "record" in training else None
    out_record = read_record(output["record"], OutputRecord) if "record" in output else None
    return {
        "job_id": job_id,
        "versions": versions,
        "resubmitted_versions": resubmits,
        "chain_run": run.run_id,
        "chain_status": run.status.value,
        "trained_on": training.get("snapshot/version_id"),
        "holdout_accuracy": training.get("holdout_accuracy"),
        "predictions": predictions.get("table_path"),
        "reconciliation": record.reconciliation.as_dict() if record else None,
        "checkpoint_sha256": record.checkpoint.sha256 if record else None,
        "output_bundle": (
            {**out_record.output.model_dump(), "path": out_record.bundle_path}
            if out_record
            else None
        ),
        "output_content_sha256": out_record.output.content_sha256 if out_record else None,
    }


def print_summary(s: dict, wall: float) -> None:
    """The short human summary at the end of the demo."""
    print("\n=== summary ===")
    print(f"Compute job {s['job_id']}:")
    for v in s["versions"]:
        print(
            f"  {v['version_id']}  {v['status']:<9} attempt {v['attempt']}  items {v['items']:>5}"
            f"  accepted {v['accepted']}  failed {v['failed']}  abstained {v['abstained']}"
            f"  outstanding {v['outstanding']}  parent {v['parent_version_id'] or '-'}"
        )
    print(f"resubmitted outstanding items of: {', '.join(s['resubmitted_versions']) or 'none'}")
    print(f"chain run {s['chain_run']}: {s['chain_status']}, trained on {s['trained_on']}")
    rec = s["reconciliation"] or {}
    print(
        f"reconciled: {rec.get('ok')}  iterated {rec.get('items_iterated')} of "
        f"{rec.get('items_expected')}  by status {rec.get('by_status_found')}  "
        f"outstanding {rec.get('outstanding')}"
    )
    acc = s["holdout_accuracy"]
    print(f"held-out accuracy (vs Compute labels): {acc:.4f}" if acc is not None else "no accuracy")
    if s.get("truth_accuracy") is not None:
        print(
            f"accuracy vs true labels, {s['truth_items']} items outside the labelled reference: "
            f"{s['truth_accuracy']:.4f}"
        )
    ob = s["output_bundle"] or {}
    print(f"checkpoint sha256: {s['checkpoint_sha256']}")
    print(f"output bundle: {ob.get('version_id')}  content_sha256 {ob.get('content_sha256')}")
    print(f"               {ob.get('path')}")
    print(f"wall time: {wall:.1f}s")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction between 0 and 1")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number > 0")
    return value


#: Where the demo declares its chain; `make ui` reads it from there.
DEMO_CHAINS = "chains.yaml"


def write_demo_chains(home: Path, trainer: str, config: dict) -> Path:
    """Declare the demo's chain (the default one, its trainer and config) in ``home``."""
    path = home / DEMO_CHAINS
    text = yaml.safe_dump({"default_chain": {"trainer": trainer, "config": config}})
    atomic_write_text(path, "# written by `make demo`; `make ui` reads it\n" + text)
    return path


def main(argv: list[str] | None = None) -> int:
    """Run the demo; exit 0 only if the chain succeeded from a complete bundle and reconciled."""
    p = argparse.ArgumentParser(
        prog="python -m pipeline.defs.demo",
        description=__doc__.split("\n")[0],
        epilog="Everything else comes from the LITHI_* variables (README, Configuration); "
        "LITHI_TRAINER_CONFIG defaults to the sample's feature columns. Exit code 0 only if "
        "the chain ran from a complete, reconciled bundle; 2 for a bad option.",
    )
    p.add_argument(
        "--sample",
        default="digits",
        choices=sorted(samples.SAMPLE_NAMES),
        help="data set to label and train on: digits (1,797 8x8 images, one 64-float vector), "
        "wine (178 rows, 13 scalar columns) or synthetic (--items N, a 64-float embedding in "
        "10 classes, generated and staged in batches) (default: %(default)s)",
    )
    p.add_argument(
        "--items",
        type=_positive_int,
        default=None,
        help="how many items the synthetic sample has (only with --sample synthetic; "
        "default 10000)",
    )
    p.add_argument(
        "--lose-fraction",
        type=_fraction,
        default=0.3,
        help="share of items the first Compute attempt loses to a simulated worker crash, "
        "0..1; above 0 the job ends PARTIAL and the sensor resubmits (default: %(default)s)",
    )
    p.add_argument(
        "--fail-item-fraction",
        type=_fraction,
        default=0.02,
        help="share of computed items that fail individually (a result row with status "
        "failed, counted, never dropped), 0..1 (default: %(default)s)",
    )
    p.add_argument(
        "--world-size",
        type=_positive_int,
        default=2,
        help="training ranks: 1 trains in the Dagster step, more run as torchrun processes "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=900,
        help="seconds to wait for the chain to finish before giving up (default: %(default)s)",
    )
    args = p.parse_args(argv)
    if args.items is not None and args.sample != samples.SYNTHETIC:
        p.error(f"--items sizes the synthetic sample only; {args.sample} has a fixed size")

    t_start = time.monotonic()
    os.environ.setdefault("DAGSTER_HOME", str(REPO_ROOT / "dagster_home"))
    try:
        settings = LithiEnv.load()
    except SettingsError as e:
        print(f"pipeline.defs.demo: {e}", file=sys.stderr)
        return 2
    home = settings.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    job_id, compute = submit_sample_job(
        args.sample,
        home,
        FaultSpec(lose_fraction=args.lose_fraction, fail_item_fraction=args.fail_item_fraction),
        compute_root=settings.compute_root_path,
        items=args.items,
    )
    print(
        f"submitted Compute job {job_id} over the {args.sample} sample ({args.lose_fraction:.0%} "
        f"of items lost to a simulated worker crash, {args.fail_item_fraction:.0%} failing)"
    )
    env = {
        **os.environ,
        "LITHI_HOME": str(home),
        "LITHI_JOB_ID": job_id,
        # A demo need not wait the production back-off unless told to.
        "LITHI_RESUBMIT_DELAY_SECONDS": str(
            settings.resubmit_delay_seconds
            if "resubmit_delay_seconds" in settings.model_fields_set
            else 1
        ),
        "LITHI_WORLD_SIZE": str(args.world_size),
    }
    if "chains" not in settings.model_fields_set:
        # The chain is declared in a file (the sample's feature columns, named, unless told
        # otherwise), not in this process's environment: `make ui` reads the same file, so a
        # Materialize there trains as the demo did.
        config = (
            json.loads(settings.trainer_config)
            if "trainer_config" in settings.model_fields_set
            else {"features": samples.sample_features(args.sample)}
        )
        env["LITHI_CHAINS"] = str(write_demo_chains(home, settings.trainer, config))
        env.pop("LITHI_TRAINER_CONFIG", None)
    log_path = home / "logs" / f"daemon-{job_id}.log"
    import pipeline.defs.definitions  # noqa: F401 - fail here, loudly, if the code location is broken

    # Create and migrate the instance before the daemon starts, so no two processes ever race
    # to create its schema (and a home without a dagster.yaml gets the project's).
    prepare_instance(env["DAGSTER_HOME"])
    with dg.DagsterInstance.get() as instance:
        print(f"starting dagster-daemon (log: {log_path}); DAGSTER_HOME={env['DAGSTER_HOME']}")
        daemon = start_daemon(env, log_path)
        try:
            run = wait_for_chain(instance, compute, job_id, daemon=daemon, timeout=args.timeout)
            summary = summarize(instance, compute, job_id, run, settings.cache_path)
        except TimeoutError as e:
            raise SystemExit(f"{e}; the daemon's log is {log_path}") from None
        finally:
            stop_daemon(daemon)
    if summary["predictions"]:
        summary["truth_accuracy"], summary["truth_items"] = truth_accuracy(
            args.sample, summary["predictions"]
        )
    print_summary(summary, time.monotonic() - t_start)
    (home / "logs" / f"summary-{job_id}.json").write_text(json.dumps(summary, indent=2))
    ok = summary["chain_status"] == "SUCCESS" and (summary["reconciliation"] or {}).get("ok")
    if not ok:
        print(
            "FAILED: the chain did not finish from a complete, reconciled bundle", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
