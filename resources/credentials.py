"""The credential registry: a ``credential_ref`` names an environment variable, never a secret.

``input.credential_ref`` in a manifest, a job spec or a Dagster config holds only a registered
name. The secret is read from the environment at the moment of a download, wrapped in
:class:`Secret` so an accidental ``repr``, log line or f-string shows ``***``, and revealed only
where it becomes fsspec storage options.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from fsspec.utils import get_protocol

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MASK = "***"


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
            return {"key": key, "secret": rest}
        return {"token": secret}
