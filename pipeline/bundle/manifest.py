"""``result-manifest.json`` v1 as pydantic models: validated at the edge, plain data inside.

The manifest is the only complete-bundle marker and binds every file, count and schema. The
models below enforce every rule that can be checked from the manifest alone; the rules that
need the files (digests, row counts, Parquet schemas, id uniqueness) live in ``verify``.

A manifest is untrusted input: :func:`parse_manifest` reads it in pydantic strict mode (no
``"1034"`` for a number, no ``true`` for ``1``, no epoch number for a date), as UTF-8 only, with
its size, nesting, string lengths, list lengths and integers bounded, and duplicate keys refused.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Annotated, Literal

import pyarrow as pa
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import (
    BundleError,
    CountMismatch,
    ManifestInvalid,
    StatusMismatch,
    UnsafePath,
)

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
#: Names, ids and references: non-empty and bounded (a manifest is read before anything is trusted).
NonEmpty = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
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
        fmt.to_arrow(v)  # raises UnknownType (a ValueError) with the vocabulary in its message
        return v

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type this field maps to."""
        return fmt.to_arrow(self.type)


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
    def _only_present(self, handler: SerializerFunctionWrapHandler) -> dict:
        # An input's counts are ``{"items": n}``: the result-only counts are absent, not null.
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def by_status(self) -> dict[str, int]:
        """Accepted, failed and abstained counts (zero where not a result bundle)."""
        return {s: getattr(self, s) or 0 for s in fmt.STATUSES}


class Manifest(_Model):
    """``result-manifest.json`` v1: parse with :func:`parse_manifest`, write with ``to_json``."""

    manifest_version: Literal[1]
    kind: Kind
    snapshot: SnapshotId
    job: JobInfo | None
    input: InputRef | None
    item_id_field: NonEmpty
    schema_: Schema = Field(alias="schema")
    parts: list[FileEntry] = Field(max_length=MAX_PARTS)
    outstanding: FileEntry | None
    counts: Counts
    created_at: AwareDatetime

    @field_serializer("created_at")
    def _rfc3339(self, v: datetime) -> str:
        return v.astimezone(UTC).isoformat().replace("+00:00", "Z")

    @field_validator("manifest_version", mode="before")
    @classmethod
    def _an_integer(cls, v: object) -> object:
        # ``Literal[1]`` alone accepts ``true`` (True == 1 in Python), even in strict mode.
        if isinstance(v, bool):
            raise ValueError("manifest_version must be the integer 1, not a boolean")
        return v

    @field_validator("created_at", mode="before")
    @classmethod
    def _rfc3339_text(cls, v: object) -> object:
        # Strict mode still reads "1700000000" as an epoch; only RFC 3339 text is a v1 date. The
        # text is parsed here: the strict datetime validator then receives a datetime.
        if isinstance(v, str):
            if not _RFC3339.fullmatch(v):
                raise ValueError(
                    "created_at must be RFC 3339 text with a UTC timezone, like "
                    "2026-09-05T12:00:00.000001Z"
                )
            return datetime.fromisoformat(v)
        return v

    @field_validator("created_at")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        if v.utcoffset() != UTC.utcoffset(None):
            raise ValueError("created_at must be in UTC")
        return v

    @field_validator("parts")
    @classmethod
    def _part_paths(cls, v: list[FileEntry]) -> list[FileEntry]:
        for i, p in enumerate(v):
            if p.path != fmt.part_path(i):
                raise ValueError(f"part {i} must be at {fmt.part_path(i)!r}, found {p.path!r}")
        return v

    @model_validator(mode="after")
    def _rules(self) -> Manifest:
        names = self.schema_.names
        if self.item_id_field not in names:
            raise ValueError(f"item_id_field {self.item_id_field!r} is not a declared column")
        idf = self.schema_.field(self.item_id_field)
        if idf.type != "string" or idf.nullable:
            raise ValueError(
                f"item_id_field {self.item_id_field!r} must be declared string, non-null; "
                f"found {idf.type}, nullable={idf.nullable}"
            )
        if self.outstanding is not None and self.outstanding.path != fmt.OUTSTANDING_NAME:
            raise ValueError(f"outstanding must be at {fmt.OUTSTANDING_NAME!r}")
        rows = sum(p.rows for p in self.parts)
        if self.counts.items != rows:
            raise _count(f"counts.items is {self.counts.items} but the parts hold {rows} rows")
        if self.kind == "input" and self.input is not None:
            raise ValueError("an input bundle has no input")
        if self.kind != "input" and self.input is None:
            raise ValueError(f"a {self.kind} bundle must name its input snapshot")
        if self.kind == "result":
            self._result_rules()
        else:
            if self.job is not None:
                raise ValueError(f"job is only for result bundles, not {self.kind}")
            if self.outstanding is not None:
                raise ValueError("outstanding is only for result bundles")
            extra = [
                s for s in (*fmt.STATUSES, "outstanding") if getattr(self.counts, s) is not None
            ]
            if extra:
                raise ValueError(f"counts {extra} are only for result bundles")
        return self

    def _result_rules(self) -> None:
        if self.job is None:
            raise ValueError("a result bundle must describe its job")
        missing = [c for c in fmt.RESULT_COLUMNS if c not in self.schema_.names]
        if missing:
            raise ValueError(f"a result bundle must declare {missing}")
        for name, allowed in fmt.RESULT_COLUMN_TYPES.items():
            found = self.schema_.field(name).type
            if found not in allowed:
                raise ValueError(
                    f"result column {name!r} must be declared {' or '.join(allowed)}, found {found}"
                )
        c = self.counts
        if None in (c.accepted, c.failed, c.abstained, c.outstanding):
            raise ValueError(
                "a result bundle's counts need accepted, failed, abstained, outstanding"
            )
        if c.accepted + c.failed + c.abstained != c.items:  # type: ignore[operator]
            raise _count(
                f"accepted {c.accepted} + failed {c.failed} + abstained {c.abstained} "
                f"!= items {c.items}"
            )
        out_rows = self.outstanding.rows if self.outstanding else 0
        if c.outstanding != out_rows:
            raise _count(f"counts.outstanding is {c.outstanding}, outstanding file has {out_rows}")
        partial = out_rows > 0
        if partial != (self.job.status == "PARTIAL"):
            raise _status(
                f"job status {self.job.status} with {out_rows} outstanding items: a result "
                "is PARTIAL exactly when it has outstanding items"
            )
        if partial:
            na = self.job.next_action
            if na is None or na.items != out_rows:
                raise _status(
                    f"a PARTIAL job needs next_action resubmit_outstanding with items={out_rows}"
                )
        elif self.job.next_action is not None:
            raise _status(f"a {self.job.status} job has no next_action")

    @property
    def bound_files(self) -> list[FileEntry]:
        """Every bound data file in manifest order: parts, then the outstanding list."""
        return [*self.parts, *([self.outstanding] if self.outstanding else [])]

    @property
    def is_partial(self) -> bool:
        """Whether this is a PARTIAL result (some submitted items have no result yet)."""
        return self.job is not None and self.job.status == "PARTIAL"

    def to_json(self) -> str:
        """Serialise as the canonical manifest text (aliases, sorted nothing, trailing newline)."""
        return self.model_dump_json(by_alias=True, indent=2) + "\n"


_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})")


def _count(msg: str) -> PydanticCustomError:
    return PydanticCustomError("count_mismatch", msg)


def _status(msg: str) -> PydanticCustomError:
    return PydanticCustomError("status_mismatch", msg)


_ERROR_TYPES = {
    "count_mismatch": CountMismatch,
    "status_mismatch": StatusMismatch,
    "unsafe_path": UnsafePath,
}


def parse_manifest(text: str | bytes, *, path: str = fmt.MANIFEST_NAME) -> Manifest:
    """Parse and validate manifest text strictly; raise a :class:`BundleError` naming each problem.

    The text is untrusted: it must be UTF-8 (no byte-order mark), at most
    ``MAX_MANIFEST_BYTES``, JSON without duplicate keys or non-finite numbers, and satisfy the v1
    model in pydantic strict mode (JSON types exactly as declared, every integer in int64 range).
    Nesting is bounded by pydantic's JSON parser, so no input can exhaust the stack.
    """
    if isinstance(text, str):
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ManifestInvalid(f"{path} is not UTF-8 text: {e.reason}", path=path) from None
    else:
        data = bytes(text)
    if len(data) > fmt.MAX_MANIFEST_BYTES:
        raise ManifestInvalid(
            f"{path}: {len(data)} bytes, expected at most {fmt.MAX_MANIFEST_BYTES}", path=path
        )
    _require_utf8(data, path)
    try:
        manifest = Manifest.model_validate_json(data, strict=True)
    except ValidationError as e:
        json_errors = [err for err in e.errors() if err["type"] == "json_invalid"]
        if json_errors:
            reason = json_errors[0]["msg"].removeprefix("Invalid JSON: ")
            raise ManifestInvalid(f"{path} is not JSON: {reason}", path=path) from None
        raise bundle_error(e, path=path) from None
    _refuse_duplicate_keys(data, path)
    return manifest


def _require_utf8(data: bytes, path: str) -> None:
    """Refuse anything but UTF-8 without a byte-order mark (``json.loads`` guesses UTF-16/32)."""
    if data.startswith(b"\xef\xbb\xbf"):
        raise ManifestInvalid(
            f"{path} starts with a UTF-8 byte-order mark; expected UTF-8 without one", path=path
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        hint = " (it looks like UTF-16 or UTF-32)" if b"\x00" in data[:4] else ""
        raise ManifestInvalid(
            f"{path} is not UTF-8: byte {e.start} is {data[e.start : e.start + 1]!r}{hint}",
            path=path,
        ) from None


def _refuse_duplicate_keys(data: bytes, path: str) -> None:
    """Refuse a key given twice in one object: parsers disagree on which one wins.

    Runs only after the strict model accepted the text, so the document is known to be small in
    depth and free of huge numbers; Python's parser is safe on it.
    """

    def pairs(items: list[tuple[str, object]]) -> dict:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise ManifestInvalid(f"{path}: key {key!r} appears twice in one object", path=path)
            seen.add(key)
        return dict(items)

    def no_constant(name: str) -> None:
        raise ManifestInvalid(f"{path} is not JSON: {name} is not a JSON number", path=path)

    json.loads(data, object_pairs_hook=pairs, parse_constant=no_constant)


def bundle_error(e: ValidationError, *, path: str = fmt.MANIFEST_NAME) -> BundleError:
    """Turn a manifest ``ValidationError`` into the most specific :class:`BundleError`.

    A single kind of problem (a count, the PARTIAL rule, an unsafe path) gets its own class so
    callers can tell them apart; a mix of problems is a plain :class:`ManifestInvalid`. Each
    problem names its field, what was expected and what was found.
    """
    problems = "; ".join(
        f"{'.'.join(str(x) for x in err['loc']) or '<root>'}: {err['msg']}{_found(err)}"
        for err in e.errors()
    )
    kinds = {_ERROR_TYPES.get(err["type"], ManifestInvalid) for err in e.errors()}
    cls = kinds.pop() if len(kinds) == 1 else ManifestInvalid
    return cls(f"{path} does not satisfy manifest v1: {problems}", path=path)


def _found(err: dict) -> str:
    """`` (found <value>)`` for a scalar input, shortened; nothing for objects and lists."""
    value = err.get("input")
    if err["type"] in _ERROR_TYPES or isinstance(value, (dict, list)):
        return ""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f" (found a {value.bit_length()}-bit integer)"
    text = json.dumps(value) if isinstance(value, (str, bool, int, float, type(None))) else ""
    if not text or text in err["msg"]:
        return ""
    return f" (found {text[:60]}{'...' if len(text) > 60 else ''})"


def json_schema() -> dict:
    """The JSON Schema of manifest v1, as checked into ``docs/result-manifest.schema.json``."""
    schema = Manifest.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Lithi result-manifest.json v1"
    return schema


def json_schema_text() -> str:
    """The JSON Schema as the exact text checked in (stable key order, trailing newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
