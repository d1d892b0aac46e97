"""Fixtures shared by the whole suite, and the Hypothesis profiles.

Session fixtures are read-only by contract: a staged bundle never changes, so one labelled job
per sample (and one persisted instance with a finished chain run) serves every test that only
reads it. ``HYPOTHESIS_PROFILE=dev`` (``make test-fast``) runs fewer examples, and a fixed
quarter of the cases of each test marked ``exhaustive`` (a cross product of shapes, every case
of which ``make test`` runs).

Switches for the whole run: its files go to memory when there is room (tests/helpers/scratch.py);
torch keeps to one thread here (unless ``OMP_NUM_THREADS`` says); fsync is off
(``pipeline.bundle.atomic.DURABLE``) except in tests marked ``durable``, since only a power loss
could observe it; and every ``pytest.mark.timeout`` (the ini's default included) is multiplied
by ``LITHI_TEST_TIME_SCALE`` (tests/helpers/timing.py).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from pipeline.bundle import atomic
from tests.helpers import scratch
from tests.helpers.timing import TIME_SCALE, limit

if TYPE_CHECKING:  # the fixtures import what they build when first asked (see pytest_configure)
    from pipeline.readers import Index
    from tests.helpers.chain import LabelledSamples, LineageInstance
    from tests.helpers.compute import StagedSample
    from tests.helpers.s3 import S3Store

settings.register_profile("ci", max_examples=200, deadline=None)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
DEV = os.environ.get("HYPOTHESIS_PROFILE") == "dev"
SAMPLE = 4  # the dev profile runs one case in SAMPLE of a test marked `exhaustive`

SCRATCH = pytest.StashKey[Path]()
PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path factory reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    # The run's files in memory when there is room (tests/helpers/scratch.py says why), unless
    # the run chose a place itself (TMPDIR or --basetemp).
    root = None if os.environ.get("TMPDIR") or config.option.basetemp else scratch.memory_root()
    if root is not None:
        folder = scratch.run_folder(root)
        os.environ["TMPDIR"] = tempfile.tempdir = str(folder)  # and the processes tests start
        config.option.basetemp = str(folder / "basetemp")
        config.stash[SCRATCH] = folder
    atomic.DURABLE = False  # before any fixture stages a bundle; see the `durable` fixture
    if _xdist_controller(config):
        return  # runs no test: torch, Dagster and the helpers load in the workers only
    import torch

    # One intra-op thread for torch in this process, unless OMP_NUM_THREADS says otherwise: tests
    # run one at a time on tensors far too small to gain from a second thread, and on a busy
    # 2-core machine the threads only contend (a third less CPU for the training tests). Not
    # exported: Arrow sizes its own pool by OMP_NUM_THREADS, and its CSV errors read differently
    # with one thread (docs/conformance.md quotes them).
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands tests to pytest-xdist's workers rather than running them."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[PASSED] = exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if DEV:
        terminalreporter.write_line(
            f"dev profile: fewer Hypothesis examples, 1 in {SAMPLE} cases of each exhaustive "
            "matrix (make test runs them all)"
        )
    folder = config.stash.get(SCRATCH, None)
    if folder is not None and exitstatus != 0:
        terminalreporter.write_line(f"this run's files are kept in {folder} (in memory)")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(SCRATCH, None)
    if folder is not None and config.stash.get(PASSED, False):
        gc.collect()  # what tests left to the garbage collector closes while its files exist
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def durable(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """fsync on for a test marked ``durable`` (the crash tests), off for every other one."""
    on = request.node.get_closest_marker("durable") is not None
    monkeypatch.setattr(atomic, "DURABLE", on)
    return on


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The dev profile's sample of the exhaustive matrices, and the run's time factor."""
    if DEV:
        _sample_exhaustive(config, items)
    if TIME_SCALE != 1:
        _stretch_time_limits(config, items)


def _sample_exhaustive(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the cases of each test marked ``exhaustive`` whose id hashes to one in ``SAMPLE``
    (spread over every parameter, the same in every worker of a distributed run); `make test`
    runs them all."""
    kept, dropped = [], []
    for item in items:
        whole = item.get_closest_marker("exhaustive") is None
        keep = whole or zlib.crc32(item.nodeid.encode()) % SAMPLE == 0
        (kept if keep else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _stretch_time_limits(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stretch every test's time limit by the run's factor."""
    default = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = (
            (marker.args[0] if marker.args else marker.kwargs["timeout"]) if marker else default
        )
        if seconds:
            item.add_marker(pytest.mark.timeout(limit(float(seconds))), append=False)


@pytest.fixture(scope="session")
def labelled_samples(tmp_path_factory: pytest.TempPathFactory) -> LabelledSamples:
    """Healthy digits and wine jobs on one local Compute, labelled once per session."""
    from tests.helpers.chain import label_samples

    return label_samples(tmp_path_factory.mktemp("samples"))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Index:
    """The uneven bundle most reader tests read (``tests.helpers.readers.UNEVEN_SIZES``), staged
    once per module that asks and does not index a bundle of its own."""
    from tests.helpers.readers import uneven_index

    return uneven_index(tmp_path_factory.mktemp("uneven"))


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> StagedSample:
    """The digits sample's input and reference bundles, staged once per module that asks."""
    from tests.helpers.compute import stage_digits

    return stage_digits(tmp_path_factory.mktemp("staged"))


@pytest.fixture(scope="session")
def lineage_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LineageInstance]:
    """A PARTIAL version, its resubmission and two chain runs in a persisted SQLite instance,
    built once per session."""
    from tests.helpers.chain import build_lineage_instance

    yield build_lineage_instance(tmp_path_factory.mktemp("lineage"))


@pytest.fixture(scope="session")
def s3_store() -> Iterator[S3Store]:
    """A real S3 API (moto's server on 127.0.0.1, IAM authentication on), started once per
    session; each test makes its own bucket (``S3Store.new_bucket``)."""
    from tests.helpers import s3  # moto and s3fs load only for a session that uses them

    server, store = s3.start()
    yield store
    server.stop()


@pytest.fixture
def s3(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    """The session's S3 API, its endpoint and the referenced secret in this test's environment
    (``AWS_ENDPOINT_URL_S3`` and the variable of ``tests.helpers.s3.REF``), as a user sets them."""
    for name, value in s3_store.env().items():
        monkeypatch.setenv(name, value)
    return s3_store
