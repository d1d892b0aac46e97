"""Run one attempt of a local Compute job (``python -m resources.compute.local.worker ROOT JOB N``).

This is what a detached job process executes (and what the inline executor calls directly). It
fetches the input and reference bundles through the bundle store, labels the attempt's items,
loses some on request (fault injection), and publishes a result bundle in format v1. A rerun of a
finished attempt does nothing; a rerun after a crash between publishing and recording adopts the
published version, so an attempt publishes at most one version.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import BundleExists
from pipeline.bundle.manifest import InputRef, JobInfo
from pipeline.bundle.stage import ROW_GROUP_ROWS, ReusedPart, stage
from pipeline.bundle.verify import VerifiedSnapshot, verify
from resources.bundle_store import BundleStore
from resources.compute.client import FINAL_STATES, ComputeError, check_job_id, utc_now
from resources.compute.faults import failed_items, lost_blocks, lost_items
from resources.compute.local.jobstore import AttemptRecord, JobRecord, JobStore
from resources.compute.local.labeller import make_labeller
from resources.credentials import CredentialRegistry


class InjectedFailure(RuntimeError):
    """The job was configured to fail outright (``faults.fail``)."""


@dataclass(frozen=True)
class Outcome:
    """What an attempt published."""

    version_id: str
    status: str
    items: int
    lost: int
    outstanding: int


def results_dir(root: Path, job_id: str) -> Path:
    """Where a job's result versions are published: ``root/results/<job_id>/<version_id>/``."""
    return Path(root) / "results" / check_job_id(job_id)


def version_id_for(record: JobRecord, attempt: AttemptRecord) -> str:
    """The version an attempt publishes: fixed when the attempt is created, unique per service."""
    return f"{record.job_id}-a{attempt.number:03d}-{attempt.token}"


def run_attempt(root: Path, job_id: str, number: int) -> Outcome | None:
    """Run attempt ``number`` of ``job_id`` to its end and record the outcome in ``job.json``.

    Returns None when the attempt had already finished (nothing is done twice).
    """
    root = Path(root)
    check_job_id(job_id)
    jobs = JobStore(root)
    with jobs.edit(job_id) as rec:
        att = rec.attempt(number)
        if att.state in FINAL_STATES:
            return None
        att.state, att.pid, att.started_at = "RUNNING", os.getpid(), utc_now()
        rec.state = "RUNNING"
        rec.message = f"attempt {number} running (pid {os.getpid()})"
    try:
        if rec.spec.faults.delay_seconds:
            time.sleep(rec.spec.faults.delay_seconds)
        if number == 1 and rec.spec.faults.fail:
            raise InjectedFailure("injected failure (faults.fail): the job failed outright")
        outcome = _compute(root, rec, att)
    except Exception as e:
        msg = f"attempt {number} failed: {type(e).__name__}: {e}"
        with jobs.edit(job_id) as rec:
            att = rec.attempt(number)
            att.state, att.message, att.finished_at = "FAILED", msg, utc_now()
            rec.state, rec.message = "FAILED", msg
        raise
    with jobs.edit(job_id) as rec:
        att = rec.attempt(number)
        att.state, att.version_id, att.finished_at = outcome.status, outcome.version_id, utc_now()
        att.items, att.lost = outcome.items, outcome.lost
        if outcome.version_id not in rec.versions:
            rec.versions.append(outcome.version_id)
        rec.state, rec.outstanding = outcome.status, outcome.outstanding
        rec.message = att.message = (
            f"attempt {number}: computed {outcome.items - outcome.lost} of {outcome.items} items; "
            f"{outcome.outstanding} outstanding"
        )
    return outcome


def _read_table(snap: VerifiedSnapshot) -> pa.Table:
    schema = snap.manifest.schema_.to_arrow()
    tables = [pq.read_table(p, schema=schema) for p in snap.part_paths()]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def result_schema(input_schema: pa.Schema, id_field: str) -> pa.Schema:
    """The id column, the input's other columns in order, then the four ``lithi_*`` columns."""
    fields = [input_schema.field(id_field)]
    fields += [f for f in input_schema if f.name != id_field]
    fields += [
        pa.field(fmt.STATUS_COLUMN, pa.string(), nullable=False),
        pa.field(fmt.CONFIDENCE_COLUMN, pa.float32()),
        pa.field(fmt.VERIFICATION_COLUMN, pa.string(), nullable=False),
        pa.field(fmt.LABEL_COLUMN, pa.int64()),
    ]
    return pa.schema(fields)


def _streams(spec, from_version_id: str | None) -> bool:
    """Whether an attempt can label its input batch by batch: no fault needs the whole id set.

    Lost and failed items are chosen by ranking every id (a global choice), and a resubmission
    filters by the parent's outstanding ids; anything else streams, so memory stays one batch.
    """
    f = spec.faults
    return (
        from_version_id is None
        and f.lose_fraction == 0
        and f.lose_parts == 0
        and f.fail_item_fraction == 0
    )


def _result_table(computed: pa.Table, labels, schema: pa.Schema) -> pa.Table:
    arrow = labels.to_arrow()
    columns = [computed.column(f.name) for f in schema if f.name in computed.column_names]
    columns += [arrow[n] for n in schema.names[len(columns) :]]
    return pa.Table.from_arrays(columns, schema=schema)


def _labelled_batches(snap: VerifiedSnapshot, labeller, schema: pa.Schema):
    """The input's parts read a row group at a time, labelled, as result record batches."""
    in_schema = snap.manifest.schema_.to_arrow()
    for path in snap.part_paths():
        for rb in pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP_ROWS):
            table = pa.Table.from_batches([rb])
            if not table.schema.equals(in_schema):  # a cast copies every column: only if needed
                table = table.cast(in_schema)
            yield from _result_table(table, labeller(table), schema).to_batches()


def _compute(root: Path, rec: JobRecord, att: AttemptRecord) -> Outcome:
    spec = rec.spec
    bundles = BundleStore(root / "cache", CredentialRegistry(rec.credential_env))
    fetched = bundles.fetch(spec.input_url, credential_ref=spec.credential_ref)
    inp = verify(fetched.path, trusted=bundles.trusted)
    fetched_ref = bundles.fetch(spec.reference_url, credential_ref=spec.credential_ref)
    ref = verify(fetched_ref.path, trusted=bundles.trusted)
    id_field = inp.manifest.item_id_field
    input_schema = inp.manifest.schema_.to_arrow()
    labeller = make_labeller(
        input_schema,
        _read_table(ref),
        id_field=id_field,
        reference_id_field=ref.manifest.item_id_field,
        method=spec.labeller,
        k=spec.k,
        abstain_margin=spec.abstain_margin,
    )
    schema = result_schema(input_schema, id_field)
    parent_id = att.from_version_id
    reuse: list[ReusedPart] = []
    if _streams(spec, parent_id):
        data = _labelled_batches(inp, labeller, schema)
        items, lost, outstanding_ids = inp.manifest.counts.items, set(), []
    else:
        data, items, lost, outstanding_ids, reuse = _compute_in_memory(
            root, rec, att, inp, labeller, schema
        )

    status = "PARTIAL" if outstanding_ids else "SUCCEEDED"
    version = version_id_for(rec, att)
    dest = results_dir(root, rec.job_id) / version
    try:
        stage(
            data,
            dest,
            schema=schema,
            id_field=id_field,
            kind="result",
            rows_per_part=spec.rows_per_part,
            job=JobInfo(
                job_id=rec.job_id, status=status, attempt=att.number, parent_version_id=parent_id
            ),
            input=InputRef(
                version_id=inp.identity.version_id,
                content_sha256=inp.identity.content_sha256,
                credential_ref=spec.credential_ref,
            ),
            outstanding_ids=outstanding_ids or None,
            reuse_parts=reuse,
            version_id=version,
        )
    except BundleExists:
        verify(dest)  # published by an earlier run of this attempt that crashed before recording
    return Outcome(version, status, items, len(lost), len(outstanding_ids))


def _compute_in_memory(
    root: Path, rec: JobRecord, att: AttemptRecord, inp: VerifiedSnapshot, labeller, schema
) -> tuple[pa.Table, int, set[str], list[str], list[ReusedPart]]:
    """Label an attempt whose faults or parent need the whole id set at once (see _streams)."""
    spec = rec.spec
    id_field = inp.manifest.item_id_field
    table = _read_table(inp)
    reuse: list[ReusedPart] = []
    parent_id = att.from_version_id
    if parent_id is None:
        todo = table
    else:
        parent = verify(results_dir(root, rec.job_id) / parent_id)
        if parent.manifest.input is None or parent.manifest.input.snapshot != inp.identity:
            raise ComputeError(
                f"version {parent_id} was computed from another input than {spec.input_url}"
            )
        outstanding = pq.read_table(parent.root / fmt.OUTSTANDING_NAME).column(id_field)
        todo = table.filter(
            pc.is_in(table.column(id_field), value_set=outstanding.combine_chunks())
        )
        if todo.num_rows != len(outstanding):
            raise ComputeError(
                f"version {parent_id} lists {len(outstanding)} outstanding items, the input holds "
                f"{todo.num_rows} of them"
            )
        reuse = [ReusedPart(parent.root, e) for e in parent.manifest.parts]

    ids = todo.column(id_field).to_pylist()
    faults = spec.faults
    if parent_id is None:
        lost = lost_items(ids, faults.lose_fraction, att.number)
        if faults.lose_parts:
            kept = [i for i in ids if i not in lost]
            size = spec.rows_per_part
            blocks = [kept[s : s + size] for s in range(0, len(kept), size)]
            for b in lost_blocks(len(blocks), faults.lose_parts, att.number):
                lost.update(blocks[b])
    else:
        lost = lost_items(ids, faults.resubmit_lose_fraction, att.number)
    keep_mask = pa.array([i not in lost for i in ids], type=pa.bool_())
    computed = todo.filter(keep_mask)
    labels = labeller(computed)
    broken = failed_items(computed.column(id_field).to_pylist(), faults.fail_item_fraction)
    if broken:
        mask = np.array([i in broken for i in computed.column(id_field).to_pylist()], dtype=bool)
        labels = labels.with_failures(mask)
    result = _result_table(computed, labels, schema)
    outstanding_ids = [i for i in ids if i in lost]
    return result, len(ids), lost, outstanding_ids, reuse


def main(argv: list[str] | None = None) -> int:
    """Entry point of a detached job process; the exit code says whether the attempt finished."""
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m resources.compute.local.worker ROOT JOB_ID ATTEMPT"
    if len(args) != 3 or not args[2].isdigit():
        print(usage, file=sys.stderr)
        return 2
    root, job_id, number = Path(args[0]), args[1], int(args[2])
    try:
        check_job_id(job_id)
    except ComputeError as e:
        print(f"{usage}: {e}", file=sys.stderr)
        return 2
    print(
        f"{utc_now().isoformat()} worker pid {os.getpid()}: {job_id} attempt {number}", flush=True
    )
    try:
        outcome = run_attempt(root, job_id, number)
    except Exception as e:
        print(f"{utc_now().isoformat()} attempt {number} failed: {type(e).__name__}: {e}")
        return 1
    print(f"{utc_now().isoformat()} done: {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
