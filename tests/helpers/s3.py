"""A real S3 API for tests: moto's server on 127.0.0.1, with IAM authentication on, and s3fs.

Every S3 client speaks HTTP to the store, so a test against ``moto``'s server exercises the same
requests (signed with SigV4, ranged GETs, conditional PUTs) that AWS or an S3-compatible store
answers. Authentication is switched on once the server has an IAM user: from then on a request
signed with a wrong secret is refused (403), so a test that succeeds proves its secret was used.

The endpoint reaches the client the way it reaches a user's: ``AWS_ENDPOINT_URL_S3``, which
botocore (under s3fs) honours; credentials reach it only through a credential reference.
"""

from __future__ import annotations

import logging
import os
import secrets
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import boto3
import s3fs
from moto.server import ThreadedMotoServer

#: The environment variable a registered credential reference names in the tests.
SECRET_ENV = "LITHI_TEST_S3_CREDENTIAL"
REF = "lab-s3"
#: botocore's standard endpoint setting for S3 (the README documents it for S3-compatible stores)
ENDPOINT_ENV = "AWS_ENDPOINT_URL_S3"

_POLICY = (
    '{"Version": "2012-10-17", "Statement": '
    '[{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'
)


@dataclass(frozen=True)
class S3Store:
    """A running S3 API: its endpoint and the one IAM user's access key and secret."""

    endpoint: str
    access_key: str
    secret: str

    @property
    def credential(self) -> str:
        """What the credential reference's variable holds: ``<access_key_id>:<secret>``."""
        return f"{self.access_key}:{self.secret}"

    def env(self) -> dict[str, str]:
        """The variables a user sets: the endpoint, and the secret under its reference."""
        return {ENDPOINT_ENV: self.endpoint, SECRET_ENV: self.credential}

    def fs(self) -> s3fs.S3FileSystem:
        """An s3fs client of the store for the tests' own set-up and checks (not cached)."""
        return s3fs.S3FileSystem(
            key=self.access_key,
            secret=self.secret,
            endpoint_url=self.endpoint,
            skip_instance_cache=True,
            use_listings_cache=False,
        )

    def new_bucket(self, prefix: str = "lithi") -> str:
        """A new empty bucket of a unique name (tests never share one)."""
        name = f"{prefix}-{secrets.token_hex(4)}"
        self.fs().mkdir(name)
        return name

    def upload_dir(self, local: Path, url: str) -> str:
        """Copy a local folder (a bundle) to ``url`` (``s3://bucket/prefix``), manifest last."""
        fs = self.fs()
        dest = url.removeprefix("s3://").rstrip("/")
        files = sorted(p for p in local.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == "result-manifest.json")
        for p in files:
            fs.put_file(str(p), f"{dest}/{p.relative_to(local).as_posix()}")
        return url


def start() -> tuple[ThreadedMotoServer, S3Store]:
    """Start moto's server on a free port of 127.0.0.1, create an IAM user allowed ``s3:*`` and
    switch authentication on; return the server (to stop) and the store."""
    # One access line per request from werkzeug would bury a failing test's own output.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # The server's own DEBUG lines dump each request it receives, Authorization header and all:
    # they are the store's logs, not the client's, which the secret canary reads at DEBUG.
    logging.getLogger("moto").setLevel(logging.INFO)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # Before authentication is on, any key is accepted: enough to create the user.
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName="lithi")
    iam.put_user_policy(UserName="lithi", PolicyName="s3", PolicyDocument=_POLICY)
    key = iam.create_access_key(UserName="lithi")["AccessKey"]
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=b"0",  # authenticate every request from now on
        headers={"Content-Type": "application/octet-stream"},  # a form body would be parsed away
        method="POST",
    )
    with urllib.request.urlopen(request) as response:
        response.read()
    return server, S3Store(endpoint, key["AccessKeyId"], key["SecretAccessKey"])


def child_env(store: S3Store, **extra: str) -> dict[str, str]:
    """The environment of a child process that reads the store as a user's process would."""
    return {**os.environ, **store.env(), "OMP_NUM_THREADS": "1", **extra}
