"""Which columns of a bundle a trainer may take, chosen against its declared schema.

Features are chosen from the manifest's declared schema (or the Arrow schema of a table about to
be staged): named explicitly, or chosen automatically only when asked, with every column left
out recorded with its reason; never guessed from the data. A column no model can take, or a
label that does not fit the task, is refused before any work in one line naming it, its type
and what would work (docs/reference-trainer.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Literal, NamedTuple

import pyarrow as pa

from pipeline.bundle import format as fmt
from pipeline.bundle.manifest import Schema, SchemaField
from pipeline.readers.tensors import VALID_SUFFIX
from pipeline.training.trainer import FeatureSet, TrainerError

Task = Literal["classification", "regression"]

_NUMERIC = set(fmt.NUMERIC_TYPES)
_INTEGER_LABELS = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"}
_FLOATS = set(fmt.FLOAT_TYPES)


#: A string feature is a category. (Binary stays out: a vocabulary is stored as JSON text.)
CATEGORY = "string"
#: Columns named in a refusal as ones that would work, at most.
_SHOWN = 12


def number_shape(f: SchemaField) -> tuple[str, int] | None:
    """``(scalar type, width)`` of a column usable as a number feature, else ``None``."""
    if f.width is None or f.element not in _NUMERIC:  # a list<T> has no fixed width
        return None
    return f.element, f.width


def _usable(f: SchemaField) -> bool:
    return f.type == CATEGORY or number_shape(f) is not None


def why_not_a_feature(f: SchemaField) -> str:
    """Why a declared column cannot be a feature, and what would work: ``<type>: ...``."""
    t = f.type
    text = f.element in ("string", "binary")
    if t == "binary":
        return "binary: bytes are neither numbers nor a category; a string column would work"
    if f.is_list and text:
        return (
            f"{t}: a variable-length list of {f.element} values is no single category; a "
            "string column with one value per row would work"
        )
    if f.is_list:
        return (
            f"{t}: variable length, and the model takes fixed-width input; "
            f"fixed_size_list<{f.element},N> (N values in every row) would work"
        )
    if text:  # a fixed-size list of strings or bytes
        return (
            f"{t}: a list of {f.element} values is no single category; one string column per "
            "position would work"
        )
    return f"{t}: not a numeric feature"


def _why_not_arrow(name: str, dtype: pa.DataType) -> str:
    """Why an Arrow column outside the bundle vocabulary cannot be a feature (a nested struct,
    a map, a union): it cannot even be staged; what would work."""
    if pa.types.is_struct(dtype):
        parts = ", ".join(repr(f"{name}.{dtype.field(i).name}") for i in range(dtype.num_fields))
        return (
            f"{dtype}: nested columns cannot be staged or trained on; flattening it into one "
            f"column per field ({parts}: pyarrow's Table.flatten) would work"
        )
    return (
        f"{dtype}: not a bundle type (docs/bundle-format.md); one column of a numeric or "
        "string type per value would work"
    )


class _Column(NamedTuple):
    """A column of a manifest's or an Arrow schema: its declared field, or (an Arrow type
    outside the vocabulary) ``None`` and why it cannot be used."""

    name: str
    field: SchemaField | None
    refusal: str = ""


def _columns_of(schema: Schema | pa.Schema) -> list[_Column]:
    if isinstance(schema, Schema):
        return [_Column(f.name, f) for f in schema.fields]
    out = []
    for a in schema:
        try:
            out.append(
                _Column(
                    a.name,
                    SchemaField(name=a.name, type=fmt.from_arrow(a.type), nullable=a.nullable),
                )
            )
        except ValueError:  # UnknownType, or a name the manifest would refuse
            out.append(_Column(a.name, None, _why_not_arrow(a.name, a.type)))
    return out


def _not_a_column(what: str, name: str, columns: list[_Column], usable: list[str]) -> TrainerError:
    """``<what> 'x' is not a column of this bundle``: the nearest name, and what would work."""
    near = difflib.get_close_matches(name, [c.name for c in columns], n=1)
    guess = f" (did you mean {near[0]!r}?)" if near else ""
    shown = ", ".join(repr(n) for n in usable[:_SHOWN]) + (", …" if len(usable) > _SHOWN else "")
    return TrainerError(
        f"{what} {name!r} is not a column of this bundle{guess}; columns that would work: "
        f"{shown or 'none'}"
    )


def choose_features(
    schema: Schema | pa.Schema,
    *,
    id_field: str,
    label: str,
    features: list[str],
    auto: bool,
    exclude: Iterable[str] = (),
) -> tuple[list[SchemaField], FeatureSet]:
    """The feature columns, from an explicit list or (``auto``) every numeric declared column.

    ``schema`` is a manifest's (what a bundle declares) or an Arrow schema (a table about to be
    staged). Returns the chosen fields and the :class:`FeatureSet` to record: what was used
    and, in auto mode, every column left out with the reason. An explicit column that does not
    exist or cannot be a feature is a one-line :class:`TrainerError` naming it, its type and
    what would work.
    """
    if bool(features) == auto:
        raise TrainerError(
            "name the feature columns in 'features', or set 'auto_features': true to use every "
            "numeric declared column (not both)"
        )
    columns = _columns_of(schema)
    reserved = {id_field: "the item id", label: "the label"}

    def reserved_why(name: str) -> str | None:
        if name in reserved:
            return reserved[name]
        if name.startswith(fmt.LITHI_PREFIX):
            return "a lithi_* result column"
        return None

    excluded = set(exclude)
    if auto:
        chosen, dropped = [], {}
        for c in columns:
            f = c.field
            if (why := reserved_why(c.name)) is not None:
                dropped[c.name] = why
            elif c.name.endswith(VALID_SUFFIX):
                dropped[c.name] = "a validity mask"
            elif c.name in excluded:
                dropped[c.name] = "excluded by the config"
            elif f is None:
                dropped[c.name] = c.refusal
            elif f.type == CATEGORY:
                # auto_features chose numbers before categories existed: a config that trained
                # before trains on the same columns (and writes the same checkpoint) now
                dropped[c.name] = (
                    "string: a category; name it in 'features' to use it (auto_features takes "
                    "numeric columns only)"
                )
            elif number_shape(f) is None:
                dropped[c.name] = why_not_a_feature(f)
            else:
                chosen.append(f)
        if not chosen:
            raise TrainerError(
                f"auto_features found no numeric column in {[c.name for c in columns]}"
            )
        return chosen, FeatureSet(used=[f.name for f in chosen], dropped=dropped)
    by_name = {c.name: c for c in columns}
    usable = [
        c.name
        for c in columns
        if c.field is not None and reserved_why(c.name) is None and _usable(c.field)
    ]
    chosen = []
    for name in features:
        found = by_name.get(name)
        if found is None:
            raise _not_a_column("feature", name, columns, usable)
        if (why := reserved_why(name)) is not None:
            raise TrainerError(f"feature {name!r} is {why}; it cannot be a feature")
        if found.field is None:
            raise TrainerError(f"feature {name!r} is {found.refusal}")
        if not _usable(found.field):
            raise TrainerError(f"feature {name!r} is {why_not_a_feature(found.field)}")
        if found.field in chosen:
            raise TrainerError(f"feature {name!r} is named twice in 'features'; name it once")
        chosen.append(found.field)
    return chosen, FeatureSet(used=list(features))


def check_label(schema: Schema | pa.Schema, label: str, task: Task) -> SchemaField:
    """The label column, refused with the reason if its declared type does not fit ``task``."""
    columns = _columns_of(schema)
    c = next((c for c in columns if c.name == label), None)
    if c is None:
        fitting = [
            x.name for x in columns if x.field is not None and _label_problem(x.field, task) is None
        ]
        raise _not_a_column("label", label, columns, fitting)
    if c.field is None:
        raise TrainerError(f"label {label!r} is {c.refusal}")
    problem = _label_problem(c.field, task)
    if problem is not None:
        raise TrainerError(f"label {label!r} is {problem}")
    return c.field


def _label_problem(f: SchemaField, task: Task) -> str | None:
    if task == "classification":
        if f.type in _FLOATS:
            return (
                f"{f.type}: a classification target must be an integer, bool or string column; "
                "for a continuous target use task 'regression'"
            )
        if f.type not in _INTEGER_LABELS | {"string"}:
            return f"{f.type}: not a class label"
    elif f.type not in _NUMERIC - {"date32", "timestamp[us,UTC]"}:
        return f"{f.type}: a regression target must be numeric"
    return None
