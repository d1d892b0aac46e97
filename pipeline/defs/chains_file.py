"""The chains of a code location, declared in one YAML file (``LITHI_CHAINS`` names it).

Each chain has a name, a source (a Compute job, several, or a bundle URL), a trainer and that
trainer's config; everything it builds is keyed under its name (``digits/training_run``). The
file is checked when the code location loads: a mistake stops the load with one line naming the
file, the line and the field. ``LITHI_*`` variables stay the defaults of what a chain leaves out
(the shared settings: world size, launcher, cron...) and describe the default chain, which
keeps today's unprefixed keys unless the file says ``default_chain: false``.

    default_chain: false
    chains:
      - name: digits
        source: {job_id: job-digits}
        config: {label: label, features: [embedding], epochs: 2}
      - name: wine
        source: {bundle_url: "s3://results/wine/"}
        trainer: my_team.trainers:GBMTrainer
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from pipeline.bundle.errors import problem
from pipeline.training.trainer import REFERENCE_TRAINER, TrainerError, load_trainer
from resources.compute.client import ComputeError, check_job_id
from resources.settings import SettingsError

#: A chain's name prefixes its asset keys and names its job, sensor and schedule.
CHAIN_NAME = r"[a-z][a-z0-9_]{0,39}"


class ChainsFileError(SettingsError):
    """The chains file cannot be read, or declares something wrong."""


class SourceDecl(BaseModel):
    """Where a chain's versions come from: Compute job(s), or a bundle URL with no Compute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = ""
    watch_jobs: list[str] = Field(default_factory=list)
    bundle_url: str = ""
    credential_ref: str = ""

    @field_validator("job_id")
    @classmethod
    def _job(cls, v: str) -> str:
        if v:
            try:
                check_job_id(v)
            except ComputeError as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> SourceDecl:
        if self.bundle_url and (self.job_id or self.watch_jobs):
            raise ValueError("a source is a bundle_url or Compute job(s), not both")
        if not (self.bundle_url or self.job_id or self.watch_jobs):
            raise ValueError("a source needs a job_id, watch_jobs or a bundle_url")
        return self


class _TrainedDecl(BaseModel):
    """A trainer and its config, the config checked by the trainer when the file is read (a
    config it refuses stops the load at the ``config`` field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trainer: str = REFERENCE_TRAINER
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("trainer")
    @classmethod
    def _trainer(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            raise ValueError("expected an import path 'package.module:Name'")
        try:
            load_trainer(v)
        except TrainerError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("config")
    @classmethod
    def _config(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        trainer = info.data.get("trainer")
        if trainer is None:  # the trainer itself was refused: that is the error to say
            return v
        try:
            load_trainer(trainer).parse_config(v)
        except TrainerError as e:
            raise ValueError(str(e)) from None
        return v


class ChainDecl(_TrainedDecl):
    """One chain: its name, source, trainer and the trainer's config."""

    name: str
    source: SourceDecl
    cron: str = ""  # its schedule; empty: the code location's (LITHI_CHAIN_CRON)
    publish_url: str = ""
    publish_credential_ref: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(CHAIN_NAME, v):
            raise ValueError(
                f"{v!r} is not a chain name: lowercase letters, digits and '_', starting with a "
                "letter, at most 40 (it prefixes asset keys and names jobs)"
            )
        return v


class DefaultChainDecl(_TrainedDecl):
    """The default (unprefixed) chain's trainer and config, declared here instead of in
    ``LITHI_TRAINER`` / ``LITHI_TRAINER_CONFIG``; its source stays ``LITHI_JOB_ID`` (else the
    most recently submitted job) or ``LITHI_BUNDLE_URL``."""


class ChainsFile(BaseModel):
    """The whole file: the chains, and the default (unprefixed) chain: kept (``true``), left
    out (``false``), or kept with its trainer and config declared here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_chain: bool | DefaultChainDecl = True
    chains: list[ChainDecl] = Field(default_factory=list)

    @model_validator(mode="after")
    def _some_chain(self) -> ChainsFile:
        if self.default_chain is False and not self.chains:
            raise ValueError("declares no chain: list chains, or keep the default chain")
        return self

    @field_validator("chains")
    @classmethod
    def _unique(cls, v: list[ChainDecl]) -> list[ChainDecl]:
        seen: set[str] = set()
        for c in v:
            if c.name in seen:
                raise ValueError(f"two chains are named {c.name!r}")
            seen.add(c.name)
        return v


def load_chains_file(path: str | Path) -> ChainsFile:
    """Read and check ``path``; raise :class:`ChainsFileError` with ``file:line: field: what``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ChainsFileError(f"LITHI_CHAINS={str(path)!r}: cannot read it ({e})") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}: " if mark is not None else ""
        why = getattr(e, "problem", None) or str(e)
        raise ChainsFileError(f"{path}:{line}not YAML ({why})") from None
    try:
        return ChainsFile.model_validate(data if data is not None else {})
    except ValidationError as e:
        errors = e.errors()
        # a value that fits no member of a union fails each: the deepest says the most
        first = max(errors, key=lambda err: len(err["loc"]))
        raise ChainsFileError(_located(path, root, first, _problems(errors))) from None


def _located(path: Path, root: yaml.Node | None, err: ErrorDetails, count: int) -> str:
    """One line for a validation error: where it is in the file, which field, what was wrong."""
    loc = tuple(p for p in err["loc"] if p not in _UNION_MEMBERS)
    node = _node_at(root, loc)
    line = f"{node.start_mark.line + 1}: " if node is not None else " "
    field = _dotted(loc) or "(the file)"
    more = f" (and {count - 1} more)" if count > 1 else ""
    what = "unknown field" if err["type"] == "extra_forbidden" else problem(err)
    return f"{path}:{line}{field}: {what}{more}"


#: The names pydantic puts in an error's location for the member of a union it tried.
_UNION_MEMBERS = {"bool", "DefaultChainDecl"}


def _problems(errors: list[ErrorDetails]) -> int:
    """How many things are wrong: the failures of one value against each member of a union
    count once."""
    found = set()
    for err in errors:
        loc = tuple(err["loc"])
        cut = next((i for i, p in enumerate(loc) if p in _UNION_MEMBERS), len(loc))
        found.add(loc[:cut])
    return len(found)


def _dotted(loc: tuple) -> str:
    """``('chains', 1, 'source', 'job_id')`` as ``chains[1].source.job_id``."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _node_at(root: yaml.Node | None, loc: tuple) -> yaml.Node | None:
    """The deepest YAML node along ``loc`` (the key's node for the last mapping step, so an
    unknown field points at its own line)."""
    node = root
    found = root
    for p in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((kv for kv in node.value if kv[0].value == p), None)
            if match is None:
                break
            found, node = match[0], match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and p < len(node.value):
            node = found = node.value[p]
        else:
            break
    return found
