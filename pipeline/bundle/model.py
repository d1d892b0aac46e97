"""The pieces a manifest is made of, as strict pydantic models: identities, job, schema, files.

Each model is frozen and refuses unknown keys; the bounds below apply before anything in a
manifest is trusted. :class:`~pipeline.bundle.manifest.Manifest` assembles them and adds the rules
between them; import every name from :mod:`pipeline.bundle.manifest`, which re-exports these.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from pipeline.bundle import format as fmt

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _no_control(v: str) -> str:
    """Refuse C0 control characters and DEL, as in ids: they hide in logs and break paths."""
    found = _CONTROL.search(v)
    if found:
        raise PydanticCustomError(
            "control_character",
            "holds a control character (U+{code}) at position {at}",
            {"code": f"{ord(found.group()):04X}", "at": found.start()},
        )
    return v


#: Names, ids and references: non-empty, bounded (a manifest is read before anything is
#: trusted) and free of control characters.
NonEmpty = Annotated[
    str, StringConstraints(min_length=1, max_length=1024), AfterValidator(_no_control)
]
#: See :func:`pipeline.bundle.format.check_version_id`: one path segment, the rule the cache uses.
VersionId = Annotated[str, StringConstraints(pattern=fmt.VERSION_ID_PATTERN)]
#: Counts, sizes and attempts are Parquet/Arrow int64 values.
Count = Annotated[int, Field(ge=0, le=fmt.MAX_COUNT)]
Positive = Annotated[int, Field(ge=1, le=fmt.MAX_COUNT)]
#: Parts are numbered 00000..99999; columns are bounded generously but bounded.
MAX_PARTS = 100_000
MAX_COLUMNS = 100_000
Kind = Literal["input", "result", "prediction"]
#: How the Compute job that produced a result version ended (unlike a job's live state).
ResultStatus = Literal["SUCCEEDED", "PARTIAL", "FAILED"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SnapshotId(_Model):
    """The identity to pin in an experiment record: which version, which exact bytes."""

    version_id: VersionId
    content_sha256: Sha256

    @property
    def tag(self) -> str:
        """``<version_id>:<content_sha256>``: the identity as one string, for a saved state."""
        return f"{self.version_id}:{self.content_sha256}"


class NextAction(_Model):
    """What a PARTIAL job asks of its caller: resubmit the outstanding items."""

    action: Literal["resubmit_outstanding"]
    items: Positive


class JobInfo(_Model):
    """The Compute job a result bundle came from, and which attempt produced this version."""

    job_id: NonEmpty
    status: ResultStatus
    attempt: Positive
    parent_version_id: VersionId | None = None
    next_action: NextAction | None = None


class InputRef(_Model):
    """The snapshot this bundle derives from, and the credential reference used to read it."""

    version_id: VersionId
    content_sha256: Sha256
    credential_ref: NonEmpty | None = None

    @property
    def snapshot(self) -> SnapshotId:
        """The input's identity without the credential reference."""
        return SnapshotId(version_id=self.version_id, content_sha256=self.content_sha256)


class SchemaField(_Model):
    """One declared column: its name, its vocabulary type, and whether it may hold nulls."""

    name: NonEmpty
    type: Annotated[str, StringConstraints(max_length=64)]
    nullable: bool

    @field_validator("type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        fmt.parse_type(v)  # raises UnknownType (a ValueError) with the vocabulary in its message
        return v

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type this field maps to."""
        return fmt.to_arrow(self.type)

    @property
    def element(self) -> str:
        """The scalar type: the type itself, or the element type of a list."""
        return fmt.parse_type(self.type).element

    @property
    def width(self) -> int | None:
        """Values per row: 1 for a scalar, ``N`` for ``fixed_size_list<T,N>``, ``None`` for
        ``list<T>`` (variable)."""
        return fmt.parse_type(self.type).width

    @property
    def is_list(self) -> bool:
        """Whether the column is a variable-length ``list<T>``."""
        return fmt.parse_type(self.type).is_list

    @property
    def is_fixed_size_list(self) -> bool:
        """Whether the column is a ``fixed_size_list<T,N>``."""
        return fmt.parse_type(self.type).is_fixed_size_list


class Schema(_Model):
    """Declared columns, in column order."""

    fields: list[SchemaField] = Field(min_length=1, max_length=MAX_COLUMNS)

    @field_validator("fields")
    @classmethod
    def _unique_names(cls, v: list[SchemaField]) -> list[SchemaField]:
        seen: set[str] = set()
        for f in v:
            if f.name in seen:
                raise ValueError(f"column {f.name!r} is declared twice")
            seen.add(f.name)
        # The readers add ``x__valid`` beside a nullable ``x``: a declared one would collide.
        nullable = {f.name for f in v if f.nullable}
        for f in v:
            base = f.name.removesuffix(fmt.VALID_SUFFIX)
            if f.name.endswith(fmt.VALID_SUFFIX) and base in nullable:
                raise ValueError(
                    f"column {f.name!r} collides with the null mask the readers add for the "
                    f"nullable column {base!r}; rename {f.name!r} or declare {base!r} non-null"
                )
        return v

    @property
    def names(self) -> list[str]:
        """Column names in order."""
        return [f.name for f in self.fields]

    def field(self, name: str) -> SchemaField:
        """Return the declared field ``name``, or raise ``KeyError`` naming the columns."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"column {name!r} is not declared (declared: {', '.join(self.names)})")

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema every part must have, nullability included."""
        return pa.schema([pa.field(f.name, f.arrow_type, nullable=f.nullable) for f in self.fields])

    @classmethod
    def from_arrow(cls, schema: pa.Schema) -> Schema:
        """Declare an Arrow schema in the vocabulary (dictionary strings become ``string``)."""
        return cls(
            fields=[
                SchemaField(name=f.name, type=fmt.from_arrow(f.type), nullable=f.nullable)
                for f in schema
            ]
        )


class FileEntry(_Model):
    """A bound file: where it is in the bundle and exactly what it contains."""

    path: NonEmpty
    sha256: Sha256
    bytes: Count
    rows: Count

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v or str(p) != v:
            # Its own error type: a path escaping the bundle is unsafe, not merely malformed.
            raise PydanticCustomError(
                "unsafe_path",
                "path {path} must be a normalised relative path inside the bundle "
                "(no leading '/', no '..', no '\\')",
                {"path": repr(v)},
            )
        return v


class Counts(_Model):
    """Item counts; result bundles add accepted/failed/abstained (summing to items), outstanding."""

    items: Count
    accepted: Count | None = None
    failed: Count | None = None
    abstained: Count | None = None
    outstanding: Count | None = None

    @model_serializer(mode="wrap")
    def _only_present(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An input's counts are ``{"items": n}``: the result-only counts are absent, not null.
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def by_status(self) -> dict[str, int]:
        """Accepted, failed and abstained counts (zero where not a result bundle)."""
        return {s: getattr(self, s) or 0 for s in fmt.STATUSES}
