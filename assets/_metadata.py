"""Metadata a person reads in the Dagster UI, built the same way for every asset of the chain."""

import math

import dagster as dg

from pipeline.bundle.manifest import Manifest, Schema, SchemaField, SnapshotId
from pipeline.training.trainer import FeatureSet


def digest(sha256: str) -> dg.MetadataValue:
    """A 64-hex digest, readable in full: two 32-character lines of code.

    The UI's metadata table never wraps a value, and one 64-character line is wider than its
    value column at common window sizes, so a single line is clipped; two halves fit. Programs
    read digests from the records (JSON) or with :func:`plain`.
    """
    return dg.MetadataValue.md(f"`{sha256[:32]}`  \n`{sha256[32:]}`")


def tag_run(context: dg.AssetExecutionContext, tags: dict[str, str]) -> None:
    """Add ``tags`` to the run ``context`` belongs to (nothing outside a run).

    Full digests go here as well as into the metadata: a tag is shown whole and can be copied
    from the run's page, and *Runs* filters by it (``tag:lithi/checkpoint_sha256=<digest>``),
    which no metadata value can do.
    """
    try:
        run_id = context.run.run_id
    except dg.DagsterError:  # DagsterInvalidPropertyError, not exported
        return  # an asset body called directly, outside any run (build_asset_context)
    context.instance.add_run_tags(run_id, tags)


def plain(value: object) -> str:
    """The text of a metadata value as :func:`digest` (or any other helper here) wrote it."""
    text = getattr(value, "value", value)
    return "".join(str(text).replace("`", "").split())


def identity(prefix: str, snap: SnapshotId) -> dict[str, dg.MetadataValue]:
    """``<prefix>/version_id`` and ``<prefix>/content_sha256`` for one bundle identity."""
    return {
        f"{prefix}/version_id": dg.MetadataValue.text(snap.version_id),
        f"{prefix}/content_sha256": digest(snap.content_sha256),
    }


def column_schema(schema: Schema, id_field: str) -> dg.TableSchema:
    """The declared schema as Dagster's ``dagster/column_schema``."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=f.name,
                type=f.type,
                description="item id" if f.name == id_field else None,
                constraints=dg.TableColumnConstraints(nullable=f.nullable),
            )
            for f in schema.fields
        ]
    )


def schema_of(table: dg.TableSchema) -> Schema:
    """The declared schema back from its ``dagster/column_schema`` (:func:`column_schema`)."""
    return Schema(
        fields=[
            SchemaField(name=c.name, type=c.type, nullable=c.constraints.nullable is not False)
            for c in table.columns
        ]
    )


def counts(manifest: Manifest) -> dict[str, dg.MetadataValue]:
    """Item counts by status, as numbers Dagster can plot across materializations."""
    c = manifest.counts
    out = {
        "dagster/row_count": dg.MetadataValue.int(c.items),
        "items": dg.MetadataValue.int(c.items),
    }
    for name in ("accepted", "failed", "abstained", "outstanding"):
        value = getattr(c, name)
        if value is not None:
            out[name] = dg.MetadataValue.int(value)
    return out


def markdown_table(header: list[str], rows: list[list[object]]) -> dg.MetadataValue:
    """A small Markdown table (parts, per-owner sizes, epochs)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return dg.MetadataValue.md("\n".join(lines))


def metric(value: float) -> dg.MetadataValue:
    """A metric: always a float (4 significant digits), so an accuracy of exactly 1.0 reads
    and plots as the float it is, beside its fellows, never as an integer."""
    value = float(value)
    return dg.MetadataValue.float(float(f"{value:.4g}") if math.isfinite(value) else value)


def features_table(features: FeatureSet) -> dg.MetadataValue:
    """The features a trainer used with the values it filled in each (where it says), and
    every column it left out with the reason."""
    rows: list[list[object]] = [
        [name, "used", features.filled.get(name, ""), ""] for name in features.used
    ]
    rows += [[name, "left out", "", why] for name, why in features.dropped.items()]
    return markdown_table(["column", "", "filled", "why"], rows)


def missing_values(features: FeatureSet) -> dict[str, dg.MetadataValue]:
    """What a trainer did with missing feature values, as numbers the UI can plot: the rule,
    the values filled (``fill``) or the rows dropped (``drop``); nothing if it does not say."""
    if features.missing is None:
        return {}
    out = {"missing": dg.MetadataValue.text(features.missing)}
    if features.missing == "fill":
        out["values_filled"] = dg.MetadataValue.int(sum(features.filled.values()))
    elif features.missing == "drop":
        out["rows_dropped"] = dg.MetadataValue.int(features.rows_dropped)
    return out
