"""``result-manifest.json`` v1 as pydantic models: validated at the edge, plain data inside.

The manifest is the only complete-bundle marker and binds every file, count and schema. The
models here and in :mod:`pipeline.bundle.model` enforce every rule that can be checked from the
manifest alone; the rules that need the files (digests, row counts, Parquet schemas, id
uniqueness) live in ``verify``. The lineage rules are stated once, here, for the manifest, for
``stage`` (before it writes anything) and for the command line.

A manifest is untrusted input: :func:`parse_manifest` reads it in pydantic strict mode (no
``"1034"`` for a number, no ``true`` for ``1``, no epoch number for a date), as UTF-8 only, with
its size, nesting, string lengths, list lengths and integers bounded, and duplicate keys refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import (
    BundleError,
    CountMismatch,
    ManifestInvalid,
    StatusMismatch,
    UnsafePath,
    location,
    one_line,
    problem,
)
from pipeline.bundle.model import (
    MAX_COLUMNS,
    MAX_PARTS,
    Counts,
    FileEntry,
    InputRef,
    JobInfo,
    Kind,
    NextAction,
    NonEmpty,
    ResultStatus,
    Schema,
    SchemaField,
    SnapshotId,
    _Model,
)

__all__ = [
    "KINDS",
    "MAX_COLUMNS",
    "MAX_PARTS",
    "Counts",
    "FileEntry",
    "InputRef",
    "JobInfo",
    "Kind",
    "LineageHints",
    "Manifest",
    "NextAction",
    "ResultStatus",
    "Schema",
    "SchemaField",
    "SnapshotId",
    "bundle_error",
    "check_lineage",
    "check_result_columns",
    "json_schema",
    "json_schema_text",
    "parse_manifest",
]

KINDS: tuple[Kind, ...] = ("input", "result", "prediction")


@dataclass(frozen=True)
class LineageHints:
    """How a caller tells its user to fix each lineage problem (an argument, a flag)."""

    drop_input: str = ""
    name_input: str = ""
    describe_job: str = ""
    drop_job: str = ""


def check_lineage(
    kind: str, *, has_input: bool, has_job: bool, hints: LineageHints = LineageHints()
) -> None:
    """The lineage rule, raising ``ValueError`` naming what breaks it: an input bundle derives
    from nothing; result and prediction bundles name their input snapshot; only a result bundle
    describes its job. ``hints`` end each message with the caller's own way to fix it."""

    def refuse(message: str, hint: str) -> None:
        raise ValueError(f"{message}: {hint}" if hint else message)

    if kind not in KINDS:
        refuse(f"kind must be input, result or prediction, got {kind!r}", "")
    if kind == "input" and has_input:
        refuse("an input bundle derives from nothing, so it has no input", hints.drop_input)
    if kind != "input" and not has_input:
        refuse(f"a {kind} bundle must name its input snapshot", hints.name_input)
    if kind == "result" and not has_job:
        refuse("a result bundle must describe its job", hints.describe_job)
    if kind != "result" and has_job:
        refuse(f"a job is only for result bundles, not {kind}", hints.drop_job)


def check_result_columns(schema: Schema) -> None:
    """The result columns rule, raising ``ValueError``: a result bundle declares every
    ``lithi_*`` result column, each with one of its allowed types."""
    missing = [c for c in fmt.RESULT_COLUMNS if c not in schema.names]
    if missing:
        raise ValueError(
            f"a result bundle needs the columns {', '.join(fmt.RESULT_COLUMNS)}; "
            f"missing {', '.join(missing)}"
        )
    for name, allowed in fmt.RESULT_COLUMN_TYPES.items():
        found = schema.field(name).type
        if found not in allowed:
            raise ValueError(
                f"result column {name!r} must be declared {' or '.join(allowed)}, found {found}"
            )


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
        # ``Literal[1]`` alone accepts ``true`` and ``1.0`` (both == 1 in Python), even in
        # strict mode; every other count is an integer in the JSON too.
        if isinstance(v, bool):
            raise ValueError("manifest_version must be the integer 1, not a boolean")
        if isinstance(v, float):
            raise ValueError(f"manifest_version must be the integer 1, not the number {v!r}")
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
        check_lineage(self.kind, has_input=self.input is not None, has_job=self.job is not None)
        if self.kind == "result":
            self._result_rules()
        else:
            if self.outstanding is not None:
                raise ValueError("outstanding is only for result bundles")
            extra = [
                s for s in (*fmt.STATUSES, "outstanding") if getattr(self.counts, s) is not None
            ]
            if extra:
                raise ValueError(f"counts {extra} are only for result bundles")
        return self

    def _result_rules(self) -> None:
        check_result_columns(self.schema_)
        c, job = self.counts, self.job
        accepted, failed, abstained, outstanding = c.accepted, c.failed, c.abstained, c.outstanding
        if accepted is None or failed is None or abstained is None or outstanding is None:
            raise ValueError(
                "a result bundle's counts need accepted, failed, abstained, outstanding"
            )
        if accepted + failed + abstained != c.items:
            raise _count(
                f"accepted {accepted} + failed {failed} + abstained {abstained} != items {c.items}"
            )
        out_rows = self.outstanding.rows if self.outstanding else 0
        if outstanding != out_rows:
            raise _count(f"counts.outstanding is {outstanding}, outstanding file has {out_rows}")
        assert job is not None  # check_lineage refused a result without one
        partial = out_rows > 0
        if partial != (job.status == "PARTIAL"):
            raise _status(
                f"job status {job.status} with {out_rows} outstanding items: a result "
                "is PARTIAL exactly when it has outstanding items"
            )
        if partial:
            na = job.next_action
            if na is None or na.items != out_rows:
                raise _status(
                    f"a PARTIAL job needs next_action resubmit_outstanding with items={out_rows}"
                )
        elif job.next_action is not None:
            raise _status(f"a {job.status} job has no next_action")

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

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
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
    problems = one_line(e, each=lambda err: f"{location(err)}: {problem(err)}{_found(err)}")
    kinds = {_ERROR_TYPES.get(err["type"], ManifestInvalid) for err in e.errors()}
    cls = kinds.pop() if len(kinds) == 1 else ManifestInvalid
    return cls(f"{path} does not satisfy manifest v1: {problems}", path=path)


def _found(err: ErrorDetails) -> str:
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


def json_schema() -> dict[str, Any]:
    """The JSON Schema of manifest v1, as checked into ``docs/result-manifest.schema.json``."""
    schema = Manifest.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Lithi result-manifest.json v1"
    return schema


def json_schema_text() -> str:
    """The JSON Schema as the exact text checked in (stable key order, trailing newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
