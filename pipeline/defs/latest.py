"""Print one metadata value of an asset's latest materialization, or the chain's summary line.

    python -m pipeline.defs.latest output_bundle bundle_path
    python -m pipeline.defs.latest --summary
    python -m pipeline.defs.latest --summary --chain digits    # a chain declared in LITHI_CHAINS

What a shell script needs after a run (where the output bundle is, which checkpoint digest),
read from the Dagster instance at ``DAGSTER_HOME``, the same record the UI shows. ``--summary``
is one line from the latest output bundle's record: its path and digest, the trainer's metrics
and the reconciliation of what training iterated.
"""

from __future__ import annotations

import argparse
import sys

import dagster as dg

from pipeline.training.record import OutputRecord, read_record


def summary_line(record: OutputRecord) -> str:
    """``output bundle PATH (DIGEST); METRIC VALUE, ...; reconciled N/M ...``."""
    training = record.training
    report = training.reconciliation
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(training.metrics.items()))
    where = record.published_url or record.bundle_path
    return (
        f"output bundle {where} ({record.output.content_sha256}); {metrics or 'no metrics'}; "
        f"reconciled {report.items_iterated}/{report.items_expected}, "
        f"{report.duplicates} duplicates, {report.missing} missing"
    )


def main(argv: list[str] | None = None) -> int:
    """Print the value (or the summary); exit 1 if the asset was never materialized or has no
    such key."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.defs.latest", description=__doc__)
    ap.add_argument("asset", nargs="?", default="output_bundle", help="asset key (output_bundle)")
    ap.add_argument("key", nargs="?", default="bundle_path", help="metadata key (bundle_path)")
    ap.add_argument(
        "--summary", action="store_true", help="one line: the latest output bundle and metrics"
    )
    ap.add_argument(
        "--chain", default="", help="a named chain's asset (default: the default chain)"
    )
    args = ap.parse_args(argv)
    link = "output_bundle" if args.summary else args.asset
    asset = f"{args.chain}/{link}" if args.chain else link
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey.from_user_string(asset))
    if event is None or event.asset_materialization is None:
        print(f"{asset}: never materialized on this instance", file=sys.stderr)
        return 1
    metadata = event.asset_materialization.metadata
    key = "record" if args.summary else args.key
    if key not in metadata:
        print(f"{asset}: no metadata {key!r} ({', '.join(metadata)})", file=sys.stderr)
        return 1
    value = getattr(metadata[key], "value", metadata[key])
    print(summary_line(read_record(value, OutputRecord)) if args.summary else value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
