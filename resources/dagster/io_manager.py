"""The IO manager of the chain: assets hand each other verified objects, never paths.

An asset returns a domain object (a :class:`~resources.bundle_store.SourceBundle`, a
:class:`~pipeline.bundle.VerifiedSnapshot`, an :class:`~pipeline.readers.Index`, a
:class:`~pipeline.training.record.TrainedModel`, a ``pyarrow.Table``); :class:`ChainIOManager`
writes what it needs under the asset's artifact folder and a small ref (``output.json``) beside
it. Loading rebuilds the object and checks it again on the way in — a snapshot is re-verified with
the bundle cache's trust (every rule, hashing only what the cache cannot vouch for), an index is
bound to that snapshot, a checkpoint must still match its recorded digest — so no asset body
computes a path or verifies its inputs by hand. The pattern is Dagster's own
``PartitionedParquetIOManager`` (``examples/project_fully_featured``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from pipeline.bundle.atomic import atomic_path, atomic_write_text, is_read_only
from pipeline.bundle.digest import sha256_file
from pipeline.bundle.errors import BundleError, DigestMismatch
from pipeline.bundle.fingerprint import Fingerprint, matches
from pipeline.bundle.manifest import SnapshotId
from pipeline.bundle.verify import VerifiedSnapshot
from pipeline.readers.index import Index
from pipeline.training.predictions import PredictionFile
from pipeline.training.record import RECORD_NAME, TrainedModel, TrainingRecord, read_record
from resources.bundle_store import BundleStore, SourceBundle
from resources.dagster.artifacts import ArtifactStore
from resources.dagster.clients import BundleStoreResource

REF_NAME = "output.json"
INDEX_NAME = "index.parquet"
TABLE_NAME = "table.parquet"


class StaleArtifact(BundleError):
    """What an asset recorded is no longer what is on disk (a bundle, index or checkpoint)."""


class ChainIOManager(dg.ConfigurableIOManager):
    """Stores and loads the chain's domain objects under the artifact store."""

    artifacts: ArtifactStore
    bundle_store: BundleStoreResource = Field(
        description="The bundle cache whose trust re-verifies snapshots on load."
    )

    # -- output ---------------------------------------------------------------------------------

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Write ``obj`` (and a ref to it) into the asset's folder for this run."""
        folder = self.artifacts.path(context.asset_key, context.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(obj, SourceBundle):
            ref = {"type": "source_bundle", "source": obj.model_dump(mode="json", by_alias=True)}
        elif isinstance(obj, VerifiedSnapshot):
            ref = {"type": "snapshot", "snapshot": _snapshot_ref(obj)}
        elif isinstance(obj, Index):
            ref = {"type": "index", "index": _save_index(obj, folder)}
            context.add_output_metadata({"index_path": dg.MetadataValue.path(ref["index"]["path"])})
        elif isinstance(obj, TrainedModel):
            # The index is not saved a second time: a load takes the file disjoint_index wrote
            # (or, where that is gone, rebuilds it from the snapshot) and checks it against the
            # digest in the record.
            # The checkpoint files were hashed (and made read-only) when training ended; their
            # fingerprints let a later load trust those digests, as the bundle cache does.
            ref = {
                "type": "trained_model",
                "directory": str(obj.directory),
                "snapshot": _snapshot_ref(obj.index.snapshot),
                "index": obj.index.saved_at,
                "checkpoint": {
                    rel: Fingerprint.of(obj.checkpoint_dir / rel).as_dict()
                    for rel in obj.record.checkpoint.files
                },
            }
        elif isinstance(obj, PredictionFile):
            # written in row groups by the step itself, in this folder; what it is now is
            # fingerprinted, so a load notices a file changed since
            ref = {
                "type": "table_file",
                "path": str(obj.path),
                "rows": obj.rows,
                "id_field": obj.id_field,
                "by_status": obj.by_status,
                "fingerprint": Fingerprint.of(obj.path).as_dict(),
            }
            context.add_output_metadata({"table_path": dg.MetadataValue.path(str(obj.path))})
        elif isinstance(obj, pa.Table):
            path = folder / TABLE_NAME
            with atomic_path(path) as tmp:
                pq.write_table(obj, tmp)
            ref = {"type": "table", "path": str(path), "rows": obj.num_rows}
            context.add_output_metadata({"table_path": dg.MetadataValue.path(str(path))})
        else:
            raise TypeError(
                f"{context.asset_key.to_user_string()} returned {type(obj).__name__}; the chain's "
                "IO manager stores SourceBundle, VerifiedSnapshot, Index, TrainedModel, "
                "PredictionFile, pa.Table"
            )
        atomic_write_text(folder / REF_NAME, json.dumps(ref, indent=2) + "\n")

    # -- input ----------------------------------------------------------------------------------

    def load_input(self, context: dg.InputContext) -> Any:
        """Rebuild the upstream object from its ref, checking it again on the way in.

        An input annotated ``Path`` gets a snapshot's root unverified, so an asset check can
        report what is wrong with it instead of failing to load it.
        """
        key = context.asset_key
        folder = self.artifacts.path(key, _producing_run(context))
        try:
            ref = json.loads((folder / REF_NAME).read_text())
        except FileNotFoundError:
            raise StaleArtifact(
                f"{key.to_user_string()}: no artifacts at {folder}; materialize it again"
            ) from None
        store = self.bundle_store.store()
        kind = ref["type"]
        if kind == "source_bundle":
            return SourceBundle.model_validate(ref["source"])
        if kind == "snapshot":
            if getattr(context.dagster_type, "typing_type", None) is Path:
                return Path(ref["snapshot"]["root"])  # where it is, for a check to inspect
            return _load_snapshot(ref["snapshot"], store)
        if kind == "index":
            return _load_index(ref["index"], store)
        if kind == "trained_model":
            return _load_trained_model(ref, store)
        if kind == "table":
            return pq.read_table(ref["path"])
        if kind == "table_file":
            predictions = _load_prediction_file(ref)
            # an input typed as the file streams it; any other (a user's pa.Table) gets it whole
            if getattr(context.dagster_type, "typing_type", None) is PredictionFile:
                return predictions
            return predictions.read()
        raise StaleArtifact(f"{folder / REF_NAME}: unknown artifact type {kind!r}")


def _producing_run(context: dg.InputContext) -> str:
    """The run whose artifacts to load: this run's for an upstream step of the same run, else
    the run of the asset's latest materialization (what the UI shows as current)."""
    try:
        run_id = context.upstream_output.run_id  # type: ignore[union-attr]
    except (AttributeError, dg.DagsterInvariantViolationError):
        run_id = None
    # An upstream step of this run (or of the run this one re-executes) names a real run; an
    # asset loaded from an earlier run gets a placeholder, so look up its latest materialization.
    if run_id and context.instance.has_run(run_id):
        return run_id
    event = context.instance.get_latest_materialization_event(context.asset_key)
    if event is None:
        raise StaleArtifact(
            f"{context.asset_key.to_user_string()} has never been materialized on this instance"
        )
    return event.run_id


def _read_only(path: Path) -> bool:
    try:
        return is_read_only(path.stat().st_mode)
    except OSError:
        return False


def _snapshot_ref(snapshot: VerifiedSnapshot) -> dict[str, Any]:
    return {"root": str(snapshot.root), "identity": snapshot.identity.model_dump()}


def _load_snapshot(ref: dict[str, Any], store: BundleStore) -> VerifiedSnapshot:
    snapshot = store.verify(ref["root"])
    recorded = SnapshotId.model_validate(ref["identity"])
    if snapshot.identity != recorded:
        raise StaleArtifact(
            f"{ref['root']}: recorded as {recorded.version_id} ({recorded.content_sha256}), "
            f"now holds {snapshot.identity.version_id} ({snapshot.identity.content_sha256})"
        )
    return snapshot


def _save_index(index: Index, folder: Path) -> dict[str, Any]:
    path = folder / INDEX_NAME
    index.save(path)
    return {"path": str(path), "sha256": index.digest, "snapshot": _snapshot_ref(index.snapshot)}


def _load_index(ref: dict[str, Any], store: BundleStore) -> Index:
    index = Index.load(ref["path"], snapshot=_load_snapshot(ref["snapshot"], store))
    if index.digest != ref["sha256"]:
        raise StaleArtifact(f"{ref['path']}: index_sha256 is {index.digest}, not {ref['sha256']}")
    return index


def _load_prediction_file(ref: dict[str, Any]) -> PredictionFile:
    path = Path(ref["path"])
    if not path.is_file():
        raise StaleArtifact(f"{path}: the prediction table is gone; materialize it again")
    if not matches(path, Fingerprint.from_dict(ref["fingerprint"])):
        raise StaleArtifact(f"{path}: changed since it was written; materialize it again")
    return PredictionFile(
        path=path, rows=ref["rows"], id_field=ref["id_field"], by_status=ref["by_status"]
    )


def _load_trained_model(ref: dict[str, Any], store: BundleStore) -> TrainedModel:
    directory = Path(ref["directory"])
    record = read_record(directory / RECORD_NAME, TrainingRecord)
    snapshot = _load_snapshot(ref["snapshot"], store)
    saved = ref.get("index")
    if saved and Path(saved).is_file():
        index = Index.load(saved, snapshot=snapshot)  # its ids checked against its digest
    else:
        index = Index.from_snapshot(snapshot)
    if index.digest != record.index_sha256:
        raise StaleArtifact(
            f"{directory / RECORD_NAME}: trained on index {record.index_sha256}, the snapshot "
            f"now indexes as {index.digest}"
        )
    model = TrainedModel(index, directory, record)
    prints = ref["checkpoint"]
    present = {p.relative_to(model.checkpoint_dir).as_posix() for p in _files(model.checkpoint_dir)}
    if present != set(record.checkpoint.files):
        raise DigestMismatch(
            f"{model.checkpoint_dir}: holds {sorted(present)}, its record binds "
            f"{sorted(record.checkpoint.files)}; the checkpoint changed after training",
            path=str(model.checkpoint_dir),
        )
    for rel, digest in record.checkpoint.files.items():
        path = model.checkpoint_dir / rel
        if _read_only(path) and rel in prints and matches(path, Fingerprint.from_dict(prints[rel])):
            continue  # the very file whose digest the record holds, untouched since
        found = sha256_file(path)
        if found != digest:
            raise DigestMismatch(
                f"{path}: sha256 expected {digest} (its record), found {found}; the checkpoint "
                "changed after training",
                path=str(path),
            )
    return model


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() or p.is_symlink()]
