"""Every setting of the pipeline, parsed in one place: ``LITHI_*`` environment variables.

:class:`LithiEnv` is the README's configuration table in code: each variable, its type, its
default. A bad value is refused when the code location loads, in one line that names the
variable and what was expected (:class:`SettingsError`). No Dagster here:
:class:`~resources.dagster.chain_settings.ChainSettings` is the Dagster resource the assets and
the sensor read, built from one :class:`LithiEnv` by ``pipeline.defs.definitions``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.bundle.errors import one_line, problem
from pipeline.training.device import DeviceError, check_device_setting
from pipeline.training.trainer import REFERENCE_TRAINER
from resources.compute.client import ComputeError, check_job_id
from resources.credentials import parse_credential_refs

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_PREFIX = "LITHI_"


def default_home() -> Path:
    """``LITHI_HOME``'s default: ``.lithi/`` in the checkout the code runs from, or in the
    working directory when the package is installed (never inside site-packages)."""
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / ".lithi"
    return Path.cwd() / ".lithi"


PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class SettingsError(ValueError):
    """One or more ``LITHI_*`` variables hold a value of the wrong type or range."""


class LithiEnv(BaseSettings):
    """Every ``LITHI_*`` variable, its type and its default; empty counts as unset."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="ignore", frozen=True
    )

    home: Path = Field(default_factory=default_home)
    job_id: str = ""
    watch_jobs: str = ""
    chain_cron: str = "0 3 * * *"
    max_attempts: PositiveInt = 3
    resubmit_delay_seconds: Seconds = 5.0
    max_resubmit_retries: NonNegativeInt = 3
    train_on_partial: bool = False
    world_size: PositiveInt = 1
    num_workers: NonNegativeInt = 2
    checkpoint_every: NonNegativeInt = 200
    torch_threads: NonNegativeInt = 0
    torchrun_max_restarts: NonNegativeInt = 1
    launcher: Literal["torchrun", "ray"] = "torchrun"
    ray_artifacts_url: str = ""
    ray_credential_ref: str = ""
    ray_python: str = "python"
    ray_max_restarts: NonNegativeInt = 2
    ray_worker_cpus: PositiveFloat = 1.0
    ray_worker_gpus: NonNegativeFloat = 0.0
    ray_tether_seconds: PositiveFloat = 60.0
    ray_rank_wait_seconds: PositiveFloat = 60.0
    device: str = "auto"
    compute_root: Path | None = None
    compute_executor: Literal["subprocess", "inline"] = "subprocess"
    cache_dir: Path | None = None
    rehash: bool = False
    link_local: bool = True
    artifacts_dir: Path | None = None
    credential_refs: str = ""
    credential_ref: str = ""
    trainer: str = REFERENCE_TRAINER
    trainer_config: str = "{}"
    compute: str = "local"
    bundle_url: str = ""
    publish_url: str = ""
    publish_credential_ref: str = ""
    chains: Path | None = None  # a YAML file declaring the code location's chains

    @field_validator("trainer_config")
    @classmethod
    def _json_object(cls, v: str) -> str:
        try:
            data = json.loads(v)
        except ValueError as e:
            raise ValueError(f"not JSON ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        return v

    @field_validator("trainer", "compute")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if v != "local" and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            raise ValueError("expected an import path 'package.module:Name'")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        try:
            return check_device_setting(v)
        except DeviceError as e:
            raise ValueError(str(e)) from None

    @field_validator("credential_refs")
    @classmethod
    def _refs(cls, v: str) -> str:
        parse_credential_refs(v)
        return v

    @model_validator(mode="after")
    def _one_source(self) -> LithiEnv:
        if self.bundle_url and self.compute != "local":
            raise ValueError(
                "LITHI_BUNDLE_URL trains on a bundle with no Compute service; LITHI_COMPUTE "
                "names one: set only one of them"
            )
        if self.compute == "local" and not self.bundle_url:
            # The local Compute's job-id rule, checked now rather than at the first tick.
            for name, value in (("job_id", self.job_id), *(("watch_jobs", j) for j in self.jobs)):
                if value:
                    try:
                        check_job_id(value)
                    except ComputeError as e:
                        raise ValueError(f"LITHI_{name.upper()}: {e}") from None
        return self

    @property
    def jobs(self) -> list[str]:
        """``LITHI_WATCH_JOBS`` split at commas."""
        return [j.strip() for j in self.watch_jobs.split(",") if j.strip()]

    @classmethod
    def load(cls) -> LithiEnv:
        """Read the environment now; raise :class:`SettingsError` naming every bad variable."""
        try:
            return cls()
        except ValidationError as e:
            raise SettingsError(describe(e)) from None

    def under_home(self, path: Path | None, name: str) -> Path:
        """``path`` if set, else ``<home>/<name>``, absolute."""
        return (path or self.home / name).resolve()

    @property
    def compute_root_path(self) -> Path:
        """The local Compute's root (``LITHI_COMPUTE_ROOT``, else ``<home>/compute``)."""
        return self.under_home(self.compute_root, "compute")

    @property
    def cache_path(self) -> Path:
        """The bundle cache (``LITHI_CACHE_DIR``, else ``<home>/cache``)."""
        return self.under_home(self.cache_dir, "cache")

    @property
    def artifacts_path(self) -> Path:
        """Run artifacts (``LITHI_ARTIFACTS_DIR``, else ``<home>/artifacts``)."""
        return self.under_home(self.artifacts_dir, "artifacts")

    @property
    def trainer_defaults(self) -> dict[str, Any]:
        """``LITHI_TRAINER_CONFIG`` parsed: defaults of the trainer's run config."""
        return json.loads(self.trainer_config)

    @property
    def credential_ref_map(self) -> dict[str, str]:
        """``LITHI_CREDENTIAL_REFS`` parsed: ref -> NAME of the variable holding its secret."""
        return parse_credential_refs(self.credential_refs)


def describe(e: ValidationError) -> str:
    """One line, a problem per bad variable: ``LITHI_X='value': what was expected``."""
    return one_line(e, each=_variable)


def _variable(err: ErrorDetails) -> str:
    if not err["loc"]:  # a rule between variables: its message names them
        return problem(err)
    name = ENV_PREFIX + "_".join(str(p) for p in err["loc"]).upper()
    given = err.get("input")
    shown = repr(given) if isinstance(given, str) else "<unset>"
    msg = problem(err)
    if isinstance(given, str) and given.lower() in ("nan", "inf", "-inf", "infinity"):
        msg = "expected a finite number"
    elif err["type"] in ("int_parsing", "int_from_float"):
        msg = "expected a whole number"
    elif err["type"] == "float_parsing":
        msg = "expected a number"
    elif err["type"] == "bool_parsing":
        msg = "expected true or false (also 1/0, yes/no, on/off)"
    return f"{name}={shown}: {msg}"


class Policy(BaseModel):
    """How persistent to be with a PARTIAL job, and whether incomplete data may be trained on.

    Plain data: the sensor's pure decision (``pipeline.defs.partial_policy.decide``) takes it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: PositiveInt = 3
    base_delay_seconds: Seconds = 5.0
    backoff: float = Field(default=2.0, ge=1, allow_inf_nan=False)
    train_on_partial: bool = False
    max_resubmit_retries: NonNegativeInt = 3

    def delay_before(self, attempt: int) -> float:
        """Seconds to wait after attempt ``attempt`` turned out PARTIAL before resubmitting."""
        return self.base_delay_seconds * self.backoff ** (attempt - 1)
