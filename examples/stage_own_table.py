"""Stage your own table as a result bundle the chain can train on.

    python examples/stage_own_table.py my_table.parquet --id-field id --out bundles/mine-v1

Your table (Parquet, Feather/Arrow IPC or CSV) becomes two immutable bundles: the table as it is,
staged as an input bundle at ``OUT.input``, and a result bundle at ``OUT`` that derives from it
and adds the ``lithi_*`` columns every result carries. Without ``--status-column`` every row is
``accepted`` with confidence 1.0 (you vouch for your own labels); name your own columns to carry
failures, abstentions and confidences through. Point ``LITHI_BUNDLE_URL`` at ``OUT``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq

from pipeline.bundle import BundleError, InputRef, JobInfo, stage
from pipeline.bundle import format as fmt


def read_table(path: Path) -> pa.Table:
    """Read Parquet, Feather/Arrow IPC or CSV by the file's extension."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return pq.read_table(path)
    if suffix in (".feather", ".arrow", ".ipc"):
        return feather.read_table(path)
    if suffix == ".csv":
        return pacsv.read_csv(path)
    raise ValueError(f"{path}: expected .parquet, .feather/.arrow or .csv")


def result_columns(
    table: pa.Table, status_column: str | None, confidence_column: str | None
) -> pa.Table:
    """The table without its own status/confidence columns, plus the three ``lithi_*`` ones."""
    n = table.num_rows
    status = (
        table.column(status_column).cast(pa.string())
        if status_column
        else pa.array(["accepted"] * n, pa.string())
    )
    confidence = (
        table.column(confidence_column).cast(pa.float32())
        if confidence_column
        else pa.array([1.0] * n, pa.float32())
    )
    keep = [c for c in table.column_names if c not in (status_column, confidence_column)]
    table = table.select(keep)
    return (
        table.append_column(pa.field(fmt.STATUS_COLUMN, pa.string(), nullable=False), status)
        .append_column(fmt.CONFIDENCE_COLUMN, confidence)
        .append_column(
            pa.field(fmt.VERIFICATION_COLUMN, pa.string(), nullable=False),
            pa.array(["not_run"] * n, pa.string()),
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Stage the input bundle, then the result bundle that derives from it; print both."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", type=Path, help="your table: .parquet, .feather/.arrow or .csv")
    ap.add_argument("--id-field", required=True, help="the item id column (made a string)")
    ap.add_argument("--out", required=True, type=Path, help="the result bundle to create")
    ap.add_argument("--status-column", help="your accepted/failed/abstained column, if any")
    ap.add_argument("--confidence-column", help="your per-row confidence column, if any")
    ap.add_argument("--rows-per-part", type=int, default=65_536)
    args = ap.parse_args(argv)
    try:
        table = read_table(args.table)
        if args.id_field not in table.column_names:
            raise ValueError(f"{args.table}: no column {args.id_field!r} ({table.column_names})")
        ids = table.column(args.id_field)
        if not pa.types.is_string(ids.type):
            print(f"note: {args.id_field!r} is {ids.type}; ids are staged as strings")
            table = table.set_column(
                table.column_names.index(args.id_field), args.id_field, pc.cast(ids, pa.string())
            )
        own = [c for c in table.column_names if c.startswith(fmt.LITHI_PREFIX)]
        if own:
            raise ValueError(f"{args.table}: columns {own} use the reserved lithi_ prefix")
        inp = stage(
            table,
            args.out.with_name(args.out.name + ".input"),
            id_field=args.id_field,
            kind="input",
            rows_per_part=args.rows_per_part,
        )
        result = stage(
            result_columns(table, args.status_column, args.confidence_column),
            args.out,
            id_field=args.id_field,
            kind="result",
            rows_per_part=args.rows_per_part,
            job=JobInfo(job_id=f"own-{args.out.name}", status="SUCCEEDED", attempt=1),
            input=InputRef(
                version_id=inp.identity.version_id, content_sha256=inp.identity.content_sha256
            ),
        )
    except (OSError, ValueError, BundleError) as e:
        print(f"stage_own_table: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    m = result.manifest
    print(f"input bundle   {inp.root}  {inp.identity.content_sha256}")
    print(f"result bundle  {result.root}  {result.identity.content_sha256}")
    print(f"               {m.counts.items} items in {len(m.parts)} part(s), kind {m.kind}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
