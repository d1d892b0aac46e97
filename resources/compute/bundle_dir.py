"""A result bundle at a URL, with no Compute service behind it, seen as a read-only Compute job.

``LITHI_BUNDLE_URL`` points the chain at one bundle (a plain path, ``file://``, ``s3://`` with a
credential reference; an S3-compatible store's endpoint comes from ``AWS_ENDPOINT_URL_S3``). Its
newer versions are the bundles beside it, in the same parent directory (the same prefix of a
bucket), whose manifest names it as ``job.parent_version_id`` — the way a Compute service
publishes a resubmission's result. :class:`BundleDirectory` presents that lineage through the
:class:`~resources.compute.client.ComputeClient` interface, so the result manifest asset and the
sensor treat it like any job: the newest version in the lineage is the job's latest, and the
sensor rebuilds the chain when a newer one lands. It only follows: it defines neither ``submit``
nor ``resubmit`` (:attr:`can_resubmit` is false), so a PARTIAL version is trained on only when
allowed.
"""

from __future__ import annotations

import posixpath

from pipeline.bundle import format as fmt
from pipeline.bundle.errors import BundleError, IncompleteBundle
from pipeline.bundle.manifest import Manifest
from resources.bundle_store import BundleStore
from resources.compute.client import (
    ComputeClient,
    ComputeError,
    JobStatus,
    UnknownJob,
)


class BundleSourceError(ComputeError):
    """The bundle URL cannot be read, has no manifest, or its lineage is ambiguous."""


class BundleDirectory(ComputeClient):
    """The bundle at ``url`` and the newer versions beside it, as one read-only job."""

    def __init__(self, url: str, store: BundleStore, credential_ref: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.store = store
        self.credential_ref = credential_ref

    def _manifest(self, url: str) -> Manifest:
        try:
            fs, root = self.store.open_location(url, self.credential_ref)
            if not fs.isdir(root):
                raise BundleSourceError(f"bundle URL {url}: no such directory; nothing to train on")
            return self.store.read_manifest(url, self.credential_ref)
        except IncompleteBundle:
            raise BundleSourceError(
                f"bundle URL {url}: no {fmt.MANIFEST_NAME}, so it is not a finished bundle "
                "(part files alone never mean the job finished); nothing to train on"
            ) from None
        except BundleError as e:
            raise BundleSourceError(f"bundle URL {url}: {e}") from None
        except (OSError, ValueError) as e:  # fsspec: unknown protocol, unreachable, denied
            raise BundleSourceError(f"bundle URL {url}: cannot be read ({e})") from None

    def _lineage(self) -> list[tuple[str, Manifest]]:
        """``(url, manifest)`` of the bundle at :attr:`url`, then each newer version in turn."""
        first = self._manifest(self.url)
        fs, root = self.store.open_location(self.url, self.credential_ref)
        parent = posixpath.dirname(root.rstrip("/"))
        # Object-store clients cache listings per instance (s3fs for as long as the process
        # lives when no credential makes the instance private): a new version must be seen.
        fs.invalidate_cache()
        siblings: dict[str, list[tuple[str, Manifest]]] = {}
        for entry in fs.ls(parent, detail=False):
            path = entry.rstrip("/")
            if posixpath.basename(path).startswith("."):
                continue  # hidden: work in progress (a staging folder), never a bundle
            if path == root.rstrip("/") or not fs.isfile(posixpath.join(path, fmt.MANIFEST_NAME)):
                continue  # the start itself, a file, or a bundle still being written
            url = fs.unstrip_protocol(path) if "://" in self.url else path
            m = self._manifest(url)
            if m.job is not None and m.job.parent_version_id:
                siblings.setdefault(m.job.parent_version_id, []).append((url, m))
        chain = [(self.url, first)]
        while children := siblings.get(chain[-1][1].snapshot.version_id):
            if len(children) > 1:
                names = ", ".join(m.snapshot.version_id for _, m in children)
                raise BundleSourceError(
                    f"bundle URL {self.url}: version {chain[-1][1].snapshot.version_id} has "
                    f"{len(children)} newer versions beside it ({names}); expected one"
                )
            chain.append(children[0])
        return chain

    @property
    def job_id(self) -> str:
        """The job's id: the version id of the bundle the URL names."""
        return self._manifest(self.url).snapshot.version_id

    def status(self, job_id: str) -> JobStatus:
        """The lineage as a job: its newest version is the latest; its status, the state."""
        chain = self._lineage()
        if job_id != chain[0][1].snapshot.version_id:
            raise UnknownJob(
                f"bundle URL {self.url} is version {chain[0][1].snapshot.version_id}, not "
                f"{job_id!r}"
            )
        url, latest = chain[-1]
        state = latest.job.status if latest.job is not None else "SUCCEEDED"
        return JobStatus(
            job_id=job_id,
            state=state,
            attempt=latest.job.attempt if latest.job is not None else 1,
            running_attempt=None,
            versions=[m.snapshot.version_id for _, m in chain],
            latest_version_id=latest.snapshot.version_id,
            latest_manifest_url=url,
            outstanding=latest.counts.outstanding or 0,
            message=f"{len(chain)} version(s) at {posixpath.dirname(self.url)}",
            updated_at=latest.created_at,
        )

    def manifest_url(self, job_id: str, version_id: str | None = None) -> str:
        """Where a version of the lineage is (the latest when ``version_id`` is None)."""
        chain = self._lineage()
        if version_id is None:
            return chain[-1][0]
        for url, m in chain:
            if m.snapshot.version_id == version_id:
                return url
        known = ", ".join(m.snapshot.version_id for _, m in chain)
        raise UnknownJob(f"bundle URL {self.url}: no version {version_id!r} (versions: {known})")

    def list_jobs(self) -> list[str]:
        """The one job: the bundle the URL names."""
        return [self.job_id]

    def latest_job(self) -> str | None:
        """The one job."""
        return self.job_id
