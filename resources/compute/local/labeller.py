"""The demo's labellers: a kNN vote checked by nearest centroid, and a linear-cost centroid model.

The local Compute computes real results, never random numbers. ``knn`` (the default): each item
gets the majority label of its ``k`` nearest labelled reference rows (Euclidean distance over the
numeric feature columns both tables share), the vote margin as its confidence, an abstention when
the margin is too thin, and a verification verdict from a second, independent method. Its cost
grows with items x reference rows, so with a reference that grows with the input it is quadratic.
``centroid``: the reference is reduced once to one centroid per class and a pooled within-class
variance; each item costs ``classes x features`` however large the input, so labelling ten
million items is linear in them. Pure numpy; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.bundle import format as fmt

#: The reference bundle's label column, never a feature.
REFERENCE_LABEL_COLUMN = "label"
_CHUNK_ROWS = 2048  # bounds the distance matrix to chunk x reference rows
#: The labelling methods a job may ask for (``JobSpec.labeller``).
LABELLERS = ("knn", "centroid")


class LabellerError(ValueError):
    """Input and reference cannot be labelled together (no shared features, no labels)."""


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_feature_type(t: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(t):
        return _is_numeric(t.value_type)
    return _is_numeric(t)


def feature_columns(
    input_schema: pa.Schema, reference_schema: pa.Schema, *, id_field: str, reference_id_field: str
) -> list[str]:
    """Numeric columns (scalars and fixed-size lists) both tables share, in the input's order.

    The id columns, the reference's ``label`` column and ``lithi_*`` columns are never features;
    a column counts as shared only when its type is the same on both sides.
    """
    excluded = {id_field, reference_id_field, REFERENCE_LABEL_COLUMN}
    cols = []
    for f in input_schema:
        if f.name in excluded or f.name.startswith(fmt.LITHI_PREFIX):
            continue
        if not _is_feature_type(f.type):
            continue
        idx = reference_schema.get_field_index(f.name)
        if idx >= 0 and reference_schema.field(idx).type == f.type:
            cols.append(f.name)
    if not cols:
        raise LabellerError(
            f"no numeric feature column is shared by the input ({input_schema.names}) and the "
            f"reference ({reference_schema.names}); expected at least one"
        )
    return cols


def feature_matrix(
    table: pa.Table, columns: list[str], dtype: type = np.float64
) -> tuple[np.ndarray, list[int]]:
    """Stack feature columns into a ``dtype`` matrix (nulls become NaN); also each column's width.

    A single list column without nulls is one reshape of its values (no fill, no stacking): the
    common embedding case, where the copies would cost more than the labelling.
    """
    blocks, widths = [], []
    for name in columns:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            width = col.type.list_size
            if col.null_count == 0 and col.offset == 0:
                values = col.flatten().to_numpy(zero_copy_only=False)
                block = values.astype(dtype, copy=False).reshape(-1, width)
            else:
                block = np.full((len(col), width), np.nan, dtype=dtype)
                valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
                if valid.any():
                    # flatten() skips null lists, so the values line up with the valid rows
                    values = col.flatten().to_numpy(zero_copy_only=False).astype(dtype)
                    block[valid] = values.reshape(-1, width)
        else:
            width = 1
            block = col.cast(pa.float64()).to_numpy(zero_copy_only=False).reshape(-1, 1)
        blocks.append(np.asarray(block, dtype=dtype))
        widths.append(width)
    return (blocks[0] if len(blocks) == 1 else np.hstack(blocks)), widths


@dataclass(frozen=True)
class Labels:
    """Per-item labeller output, aligned with the input rows."""

    status: np.ndarray  # object array of "accepted" | "abstained" | "failed"
    label: np.ndarray  # int64; meaningful where status == "accepted"
    confidence: np.ndarray  # float32 vote margin; NaN where failed
    verification: np.ndarray  # object array of "agree" | "disagree" | "not_run"

    def with_failures(self, mask: np.ndarray) -> Labels:
        """These labels with the rows in ``mask`` failed: no label, no confidence, not verified."""
        status = self.status.copy()
        status[mask] = "failed"
        confidence = self.confidence.copy()
        confidence[mask] = np.nan
        verification = self.verification.copy()
        verification[mask] = "not_run"
        return Labels(status, self.label, confidence, verification)

    def to_arrow(self) -> dict[str, pa.Array]:
        """The four result columns as Arrow arrays, nulls where a value does not exist."""
        failed = self.status == "failed"
        accepted = self.status == "accepted"
        return {
            fmt.STATUS_COLUMN: pa.array(self.status, type=pa.string()),
            fmt.CONFIDENCE_COLUMN: pa.array(self.confidence, type=pa.float32(), mask=failed),
            fmt.VERIFICATION_COLUMN: pa.array(self.verification, type=pa.string()),
            fmt.LABEL_COLUMN: pa.array(self.label, type=pa.int64(), mask=~accepted),
        }


def _scale(ref_x: np.ndarray, widths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-column centre and scale from the reference: a scalar column is standardised on its own,
    a fixed-size list as one vector (one scale for all its elements), so units never dominate."""
    centre = np.zeros(ref_x.shape[1])
    scale = np.ones(ref_x.shape[1])
    start = 0
    for w in widths:
        block = ref_x[:, start : start + w]
        if w == 1:
            centre[start] = block.mean()
            s = block.std()
        else:
            s = block.std()  # one scale across the whole vector keeps its geometry
        scale[start : start + w] = s if s > 0 else 1.0
        start += w
    return centre, scale


@dataclass(frozen=True)
class _Reference:
    """The labelled reference, complete rows only, standardised; both labellers start here."""

    centre: np.ndarray
    scale: np.ndarray
    z: np.ndarray  # [rows, features], standardised
    idx: np.ndarray  # each row's class, as an index into ``classes``
    classes: np.ndarray
    centroids: np.ndarray  # [classes, features], standardised


def _standardised_reference(ref_x: np.ndarray, ref_y: np.ndarray, widths: list[int]) -> _Reference:
    ok = ~np.isnan(ref_x).any(axis=1)
    ref_x, ref_y = ref_x[ok], np.asarray(ref_y)[ok]
    if len(ref_y) == 0:
        raise LabellerError("the reference holds no row with complete features and a label")
    centre, scale = _scale(ref_x, widths)
    z = (ref_x - centre) / scale
    classes, idx = np.unique(ref_y, return_inverse=True)
    centroids = np.stack([z[idx == c].mean(axis=0) for c in range(len(classes))])
    return _Reference(centre, scale, z, idx, classes, centroids)


def label_items(
    x: np.ndarray,
    ref_x: np.ndarray,
    ref_y: np.ndarray,
    widths: list[int],
    *,
    k: int,
    abstain_margin: float,
) -> Labels:
    """Label each row of ``x`` by a k-nearest-neighbour vote over ``(ref_x, ref_y)``.

    Confidence is the vote margin (top count minus runner-up) / k; below ``abstain_margin`` the
    item abstains. Rows with any NaN feature fail. Ties in the vote go to the smallest label.
    """
    ref = _standardised_reference(ref_x, ref_y, widths)
    ref_z, ref_idx, classes, centroids = ref.z, ref.idx, ref.classes, ref.centroids
    centre, scale = ref.centre, ref.scale
    k = min(k, len(ref_idx))

    n = len(x)
    status = np.full(n, "failed", dtype=object)
    label = np.zeros(n, dtype=np.int64)
    confidence = np.full(n, np.nan, dtype=np.float32)
    verification = np.full(n, "not_run", dtype=object)
    ok_rows = np.flatnonzero(~np.isnan(x).any(axis=1))
    ref_sq = (ref_z**2).sum(axis=1)
    cen_sq = (centroids**2).sum(axis=1)
    for start in range(0, len(ok_rows), _CHUNK_ROWS):
        rows = ok_rows[start : start + _CHUNK_ROWS]
        z = (x[rows] - centre) / scale
        z_sq = (z**2).sum(axis=1, keepdims=True)
        d = z_sq - 2 * z @ ref_z.T + ref_sq  # squared distances; order is all that matters
        nearest = np.argpartition(d, k - 1, axis=1)[:, :k]
        votes = np.zeros((len(rows), len(classes)), dtype=np.int64)
        np.add.at(votes, (np.repeat(np.arange(len(rows)), k), ref_idx[nearest].ravel()), 1)
        top = votes.argmax(axis=1)
        ordered = np.sort(votes, axis=1)
        second = ordered[:, -2] if len(classes) > 1 else np.zeros(len(rows), dtype=np.int64)
        margin = (ordered[:, -1] - second) / k
        centroid_label = (z_sq - 2 * z @ centroids.T + cen_sq).argmin(axis=1)
        label[rows] = classes[top]
        confidence[rows] = margin.astype(np.float32)
        status[rows] = np.where(margin < abstain_margin, "abstained", "accepted")
        verification[rows] = np.where(centroid_label == top, "agree", "disagree")
    return Labels(status=status, label=label, confidence=confidence, verification=verification)


def make_labeller(
    input_schema: pa.Schema,
    reference: pa.Table,
    *,
    id_field: str,
    reference_id_field: str,
    method: str = "knn",
    k: int,
    abstain_margin: float,
) -> Callable[[pa.Table], Labels]:
    """A function labelling tables of ``input_schema`` against the labelled ``reference``.

    The reference is prepared once (features, scale, centroids), so the input can stream
    through batch by batch: a row's label depends only on the row and the reference.
    """
    if method not in LABELLERS:
        raise LabellerError(f"labeller {method!r} is unknown; expected one of {LABELLERS}")
    if REFERENCE_LABEL_COLUMN not in reference.column_names:
        raise LabellerError(
            f"the reference has no {REFERENCE_LABEL_COLUMN!r} column "
            f"(columns: {reference.column_names})"
        )
    cols = feature_columns(
        input_schema, reference.schema, id_field=id_field, reference_id_field=reference_id_field
    )
    reference = reference.filter(pc.is_valid(reference.column(REFERENCE_LABEL_COLUMN)))
    ref_x, widths = feature_matrix(reference, cols)
    ref_y = reference.column(REFERENCE_LABEL_COLUMN).cast(pa.int64()).to_numpy(zero_copy_only=False)
    if method == "centroid":
        model = fit_centroids(ref_x, ref_y, widths)
        # float32: the embedding's own precision, and half the memory traffic of float64
        return lambda t: label_by_centroid(
            feature_matrix(t, cols, np.float32)[0], model, abstain_margin=abstain_margin
        )
    return lambda t: label_items(
        feature_matrix(t, cols)[0], ref_x, ref_y, widths, k=k, abstain_margin=abstain_margin
    )


def label_table(
    table: pa.Table,
    reference: pa.Table,
    *,
    id_field: str,
    reference_id_field: str,
    k: int,
    abstain_margin: float,
    method: str = "knn",
) -> Labels:
    """Label the rows of ``table`` against the labelled ``reference``; see :func:`make_labeller`."""
    labeller = make_labeller(
        table.schema,
        reference,
        id_field=id_field,
        reference_id_field=reference_id_field,
        method=method,
        k=k,
        abstain_margin=abstain_margin,
    )
    return labeller(table)


@dataclass(frozen=True)
class CentroidModel:
    """The reference reduced to what the centroid labeller needs: O(classes x features)."""

    centre: np.ndarray
    scale: np.ndarray
    classes: np.ndarray
    centroids: np.ndarray  # [classes, features], in standardised units
    variance: float  # pooled within-class variance per feature, standardised units


def fit_centroids(ref_x: np.ndarray, ref_y: np.ndarray, widths: list[int]) -> CentroidModel:
    """One centroid per class and the pooled within-class variance, from complete reference rows.

    The variance turns distances into the posterior of an isotropic Gaussian per class, so the
    confidence is a probability margin, comparable across data sets, not a raw distance.
    """
    ref = _standardised_reference(ref_x, ref_y, widths)
    resid = ref.z - ref.centroids[ref.idx]
    variance = float((resid**2).mean()) if len(ref.idx) > len(ref.classes) else 1.0
    return CentroidModel(
        ref.centre, ref.scale, ref.classes, ref.centroids, variance if variance > 0 else 1.0
    )


def label_by_centroid(x: np.ndarray, model: CentroidModel, *, abstain_margin: float) -> Labels:
    """Label each row of ``x`` by its nearest class centroid; cost linear in the rows.

    Confidence is the posterior margin (top minus runner-up) of an isotropic Gaussian per class;
    below ``abstain_margin`` the item abstains. Verification is a second, independent rule: the
    centroid nearest by angle (cosine) must agree. Rows with any NaN feature fail.
    """
    n = len(x)
    status = np.full(n, "failed", dtype=object)
    label = np.zeros(n, dtype=np.int64)
    confidence = np.full(n, np.nan, dtype=np.float32)
    verification = np.full(n, "not_run", dtype=object)
    bad = np.isnan(x).any(axis=1)
    ok_rows = np.flatnonzero(~bad)
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.float64
    # Standardising is affine, so it folds into the centroids: z . m = x . (m / s) - (c / s) . m,
    # one matrix product per chunk and no standardised copy of the rows.
    w = (model.centroids / model.scale).astype(dtype)
    bias = (model.centroids * (model.centre / model.scale)).sum(axis=1)
    cen_sq = (model.centroids**2).sum(axis=1)
    angle_norm = np.maximum(np.sqrt(cen_sq), 1e-12)
    step = _CHUNK_ROWS * 8
    for start in range(0, len(ok_rows), step):
        rows = ok_rows[start : start + step] if bad.any() else slice(start, start + step)
        dots = x[rows] @ w.T - bias  # z . m for every centroid m, z the standardised row
        # |z - m|^2 = |z|^2 - 2 z.m + |m|^2; |z|^2 is the same for every class, so it cancels
        # in the posterior and the ordering: only -2 z.m + |m|^2 matters.
        logits = (2 * dots - cen_sq) / (2 * model.variance)
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        top = p.argmax(axis=1)
        if len(model.classes) > 1:
            two = np.partition(p, -2, axis=1)
            margin = two[:, -1] - two[:, -2]
        else:
            margin = np.ones(len(top), dtype=p.dtype)
        by_angle = (dots / angle_norm).argmax(axis=1)
        label[rows] = model.classes[top]
        confidence[rows] = margin.astype(np.float32)
        status[rows] = np.where(margin < abstain_margin, "abstained", "accepted")
        verification[rows] = np.where(by_angle == top, "agree", "disagree")
    return Labels(status=status, label=label, confidence=confidence, verification=verification)
