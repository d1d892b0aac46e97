"""Print one metadata value of an asset's latest materialization.

    python -m pipeline.defs.latest output_bundle bundle_path

What a shell script needs after a run (where the output bundle is, which checkpoint digest),
read from the Dagster instance at ``DAGSTER_HOME``, the same record the UI shows.
"""

from __future__ import annotations

import argparse
import sys

import dagster as dg


def main(argv: list[str] | None = None) -> int:
    """Print the value; exit 1 if the asset was never materialized or has no such key."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.defs.latest", description=__doc__)
    ap.add_argument("asset", help="asset key, e.g. output_bundle")
    ap.add_argument("key", nargs="?", default="bundle_path", help="metadata key (bundle_path)")
    args = ap.parse_args(argv)
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(args.asset))
    if event is None or event.asset_materialization is None:
        print(f"{args.asset}: never materialized on this instance", file=sys.stderr)
        return 1
    metadata = event.asset_materialization.metadata
    if args.key not in metadata:
        print(f"{args.asset}: no metadata {args.key!r} ({', '.join(metadata)})", file=sys.stderr)
        return 1
    value = metadata[args.key]
    print(getattr(value, "value", value))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
