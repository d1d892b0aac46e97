"""The credential registry: a ``credential_ref`` names an environment variable, never a secret.

``input.credential_ref`` in a manifest, a job spec or a Dagster config holds only a registered
name. The secret is read from the environment at the moment of a download, wrapped in
:class:`Secret` so an accidental ``repr``, log line or f-string shows ``***``, and revealed only
where it becomes fsspec storage options.

Storage clients may still print what they were handed: botocore logs every request's headers at
DEBUG, the ``Authorization`` header naming the access key id among them. Every value revealed
for storage options is therefore masked in the log records of the storage client libraries
(:func:`redact_client_logs`), whatever logging the process has configured.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping

from fsspec.utils import get_protocol

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MASK = "***"
#: Loggers of the storage clients fsspec drives (by top-level package), whose records are masked.
CLIENT_LOGGERS = ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3", "aiohttp", "gcsfs")


class CredentialError(Exception):
    """A credential could not be resolved; the message names the ref and the variable only."""


class UnknownCredential(CredentialError):
    """The ``credential_ref`` is not registered."""


class MissingSecret(CredentialError):
    """The ref is registered but its environment variable is unset or empty."""


class Secret:
    """A secret value that masks itself everywhere except :meth:`reveal`.

    It refuses to be pickled, so it cannot end up in a Dagster event, a checkpoint or a cache.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself: call only where it is handed to the storage client."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{_MASK}')"

    def __str__(self) -> str:
        return _MASK

    def __format__(self, spec: str) -> str:
        return _MASK

    def __reduce__(self):
        raise TypeError("a Secret is never pickled or persisted")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))


class CredentialRegistry:
    """Registered credential references: ref name -> NAME of the environment variable.

    Secret formats per storage protocol (see :meth:`storage_options_for`): for ``s3``/``s3a`` the
    variable holds ``<access_key_id>:<secret_access_key>``; for every other protocol it holds a
    token passed as the ``token`` storage option (gcsfs takes a token or a token file there).
    """

    def __init__(self, refs: Mapping[str, str] | None = None) -> None:
        refs = dict(refs or {})
        for ref, env in refs.items():
            if not ref:
                raise ValueError("a credential_ref name must not be empty")
            if not _ENV_NAME.match(env):
                raise ValueError(
                    f"credential_ref {ref!r} must map to an environment variable name "
                    f"([A-Za-z_][A-Za-z0-9_]*), found {env!r}"
                )
        self._refs = refs

    @property
    def refs(self) -> dict[str, str]:
        """A copy of the registry: ref -> environment variable name (no secrets)."""
        return dict(self._refs)

    def __contains__(self, ref: object) -> bool:
        return ref in self._refs

    def env_var(self, ref: str) -> str:
        """The environment variable a registered ref reads, or :class:`UnknownCredential`."""
        try:
            return self._refs[ref]
        except KeyError:
            known = ", ".join(sorted(self._refs)) or "none"
            raise UnknownCredential(
                f"credential_ref {ref!r} is not registered (registered: {known})"
            ) from None

    def resolve(self, ref: str) -> Secret:
        """Read the ref's secret from the environment now (at the moment of use)."""
        env = self.env_var(ref)
        value = os.environ.get(env)
        if not value:
            raise MissingSecret(
                f"credential_ref {ref!r} reads environment variable {env}, which is "
                f"{'empty' if value == '' else 'not set'}"
            )
        return Secret(value)

    def storage_options_for(self, ref: str, url: str) -> dict[str, str]:
        """fsspec storage options carrying ``ref``'s secret for ``url``'s protocol.

        The returned dict holds the revealed secret: pass it straight to fsspec, never keep it.
        """
        secret = self.resolve(ref).reveal()
        protocol = get_protocol(url)
        if protocol in ("s3", "s3a"):
            key, sep, rest = secret.partition(":")
            if not sep or not key or not rest:
                raise MissingSecret(
                    f"credential_ref {ref!r} ({self._refs[ref]}) must hold "
                    "'<access_key_id>:<secret_access_key>' for s3 URLs"
                )
            redact_client_logs((key, rest, secret))
            return {"key": key, "secret": rest}
        redact_client_logs((secret,))
        return {"token": secret}


def parse_credential_refs(text: str) -> dict[str, str]:
    """Parse ``ref=ENV_VAR,ref2=ENV_VAR2`` (the ``LITHI_CREDENTIAL_REFS`` format) into a dict."""
    refs: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        ref, sep, env = item.partition("=")
        if not sep or not ref.strip() or not env.strip():
            raise ValueError(f"expected 'ref=ENV_VAR,...', found {item!r}")
        refs[ref.strip()] = env.strip()
    CredentialRegistry(refs)  # validates the variable names
    return refs


# -- masking what storage clients log ------------------------------------------------------------

# The values to mask live in this process's memory only, as long as the storage clients that
# were handed them may log; they are never written anywhere.
_redacted: set[str] = set()
_redact_lock = threading.Lock()
_installed = False


def redact_client_logs(values: Iterable[str]) -> None:
    """Mask ``values`` in every log record of a storage client library from now on.

    A record factory rather than a logger filter: botocore creates loggers as it imports its
    modules lazily, and a filter reaches only the logger it was added to, never its children.
    """
    global _installed
    with _redact_lock:
        _redacted.update(v for v in values if len(v) >= 4)  # masking "a" would mask everything
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args, **kwargs) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if _redacted and str(record.name).partition(".")[0] in CLIENT_LOGGERS:
                _mask(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True


def _mask(record: logging.LogRecord) -> None:
    try:
        text = record.getMessage()
    except Exception:  # a malformed record: logging reports it when a handler formats it
        return
    masked = text
    for value in list(_redacted):
        masked = masked.replace(value, _MASK)
    if masked != text:
        record.msg, record.args = masked, None
