"""Lineage as a person sees it: the real ``dagster-webserver`` and Debian's Chromium.

The webserver is started on a free loopback port over the persisted instance of a finished chain
run; Playwright drives the system Chromium (no browser download). Screenshots are saved under
``test-output/lineage/``. The GraphQL test checks the same facts one layer down.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
import pytest

from assets import CHAIN_ASSETS, CHAIN_GROUP
from pipeline.defs.jobs import CHAIN_JOB_NAME
from pipeline.training.record import read_record
from resources.settings import REPO_ROOT
from tests.helpers.chain import CHAIN_EDGES
from tests.helpers.ports import free_port
from tests.helpers.timing import limit

if TYPE_CHECKING:
    from tests.helpers.chain import LineageInstance

CHAIN = [a.key.path[-1] for a in CHAIN_ASSETS]
LOCATION = "lithi-train"  # the code location's name in workspace.yaml
SHOTS = REPO_ROOT / "test-output" / "lineage"
STARTUP_SECONDS = limit(180)
UI_WAIT_MS = int(limit(60) * 1000)  # a bound on an element appearing, not a speed

# Root in a container: no sandbox; loopback only, so nothing may try the network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Each edge of the graph, as (upstream, downstream) names: an edge path starts at the right
# side of its upstream node and ends (arrow head) at the left side of its downstream node, so
# the node box nearest to each end of the path names it.
EDGES_JS = """
() => {
  const svg = document.querySelector('svg:has(foreignObject)');
  const nodes = [...svg.querySelectorAll('foreignObject')].map(f => ({
    text: f.textContent,
    x: +f.getAttribute('x'), y: +f.getAttribute('y'),
    w: +f.getAttribute('width'), h: +f.getAttribute('height'),
  }));
  const dist = (n, p) => Math.hypot(
    Math.max(n.x - p.x, 0, p.x - (n.x + n.w)), Math.max(n.y - p.y, 0, p.y - (n.y + n.h)));
  const nearest = p => nodes.reduce((a, b) => (dist(a, p) <= dist(b, p) ? a : b)).text;
  const edges = [...svg.querySelectorAll('path')]
    .filter(p => !p.closest('marker') && p.getAttribute('fill') === 'none')
    .map(p => [nearest(p.getPointAtLength(0)), nearest(p.getPointAtLength(p.getTotalLength()))]);
  return {nodes: nodes.map(n => n.text), edges};
}
"""


def _chain_name(text: str) -> str:
    """The one chain asset named in a graph node's text."""
    found = [name for name in CHAIN if name in text]
    assert len(found) == 1, f"graph node {text!r} names {found}"
    return found[0]


@pytest.fixture(scope="module")
def webserver(lineage_instance: LineageInstance, tmp_path_factory) -> Iterator[str]:
    """A real ``dagster-webserver`` over the fixture's instance; yields its base URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("webserver") / "webserver.log"
    cmd = [
        sys.executable, "-m", "dagster_webserver", "-w", str(lineage_instance.workspace),
        "-h", "127.0.0.1", "-p", str(port),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=lineage_instance.env(),
            cwd=lineage_instance.dagster_home.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dagster-webserver exited {proc.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/server_info", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"dagster-webserver not serving {base}/server_info after "
                    f"{STARTUP_SECONDS:.0f}s:\n" + log_path.read_text()[-4000:]
                )
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=limit(30))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def page(webserver: str):
    """A Chromium page (Debian's executable, driven by Playwright) on a 1600x1000 viewport."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip(
            "BROWSER TEST SKIPPED: no `chromium` executable on PATH. Install Debian's chromium "
            "(`make browser` does it as root) to run the lineage browser test."
        )
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        except PlaywrightError as e:
            pytest.skip(f"BROWSER TEST SKIPPED: Chromium at {exe} cannot start here: {e}")
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(UI_WAIT_MS)
            expect.set_options(timeout=UI_WAIT_MS)
            yield page
        finally:
            expect.set_options(timeout=5_000)  # Playwright's default, for any later module
            browser.close()


@pytest.fixture(scope="module")
def training(lineage_instance: LineageInstance) -> dict[str, object]:
    """The latest ``training_run`` materialization's metadata, read from the instance."""
    with lineage_instance.instance() as instance:
        records = instance.fetch_materializations(dg.AssetKey("training_run"), limit=1).records
    assert records, "the fixture instance holds no training_run materialization"
    mat = records[0].asset_materialization
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def _shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.screenshot(path=str(path))
    assert path.stat().st_size > 0
    return path


def test_asset_graph_shows_the_six_assets_and_their_edges(page, webserver):
    page.goto(f"{webserver}/locations/{LOCATION}/asset-groups/{CHAIN_GROUP}/lineage")
    page.wait_for_function(
        "n => document.querySelectorAll('svg:has(foreignObject) foreignObject').length >= n",
        arg=len(CHAIN),
    )
    _shot(page, "asset_graph.png")
    for name in CHAIN:
        assert page.locator("svg foreignObject", has_text=name).count() == 1, name
    # Edges are drawn after the nodes are laid out: wait for them (bounded), then read them.
    page.wait_for_function(
        "n => [...document.querySelectorAll('svg:has(foreignObject) path')]"
        ".filter(p => !p.closest('marker') && p.getAttribute('fill') === 'none').length >= n",
        arg=len(CHAIN_EDGES),
    )
    graph = page.evaluate(EDGES_JS)
    _shot(page, "asset_graph.png")

    assert sorted(_chain_name(t) for t in graph["nodes"]) == sorted(CHAIN)
    edges = sorted((_chain_name(a), _chain_name(b)) for a, b in graph["edges"])
    assert edges == sorted(CHAIN_EDGES)


def test_training_run_page_shows_the_checkpoint_record_and_data_digest(
    page, webserver, training, lineage_instance
):
    from playwright.sync_api import expect

    record = read_record(str(training["record"]))
    page.goto(f"{webserver}/assets/training_run")
    body = page.locator("body")
    expect(body).to_contain_text(record.snapshot.version_id)
    expect(body).to_contain_text(str(training["record"]))
    assert record.snapshot.version_id == lineage_instance.version_id
    # The data digest the checkpoint was trained on, and the checkpoint's own, as its record
    # (the file beside it) says: every character on screen, none clipped by the table cell.
    for digest in (record.snapshot.content_sha256, record.checkpoint.sha256):
        for half in (digest[:32], digest[32:]):
            code = page.locator("td code", has_text=half).first
            expect(code).to_be_visible()
            box, cell = code.bounding_box(), code.locator("xpath=ancestor::td[1]").bounding_box()
            assert box["x"] + box["width"] <= cell["x"] + cell["width"], (half, box, cell)
    _shot(page, "training_run.png")

    # The loss curve: an SVG line chart inlined in the metadata, drawn, not raw Markdown.
    image = page.locator('img[src^="data:image/svg+xml"]').first
    image.scroll_into_view_if_needed()
    expect(image).to_be_visible()
    assert image.evaluate("i => i.complete && i.naturalWidth") > 0
    _shot(page, "training_run_loss_chart.png")


def test_checks_tab_shows_the_passed_check(page, webserver):
    from playwright.sync_api import expect

    page.goto(f"{webserver}/assets/training_run?view=checks")
    body = page.locator("body")
    expect(body).to_contain_text("iterated_counts_reconcile")
    expect(body).to_contain_text("Passed")
    _shot(page, "training_run_checks.png")


def test_runs_page_shows_the_rebuild_with_its_version_tag(page, webserver, lineage_instance):
    from playwright.sync_api import expect

    tag = f"lithi/version_id={lineage_instance.version_id}"
    page.goto(f"{webserver}/runs?q%5B0%5D=tag%3A{urllib.request.quote(tag, safe='')}")
    # Exactly one run carries this version's tag: the chain rebuild, with the sensor's tags.
    expect(page.get_by_role("link", name=re.compile(r"^run [0-9a-f]{8}$"))).to_have_count(1)
    expect(page.get_by_role("link", name=f"run {lineage_instance.run_id[:8]}")).to_be_visible()
    body = page.locator("body")
    expect(body).to_contain_text(CHAIN_JOB_NAME)
    expect(body).to_contain_text(f"lithi/version_id: {lineage_instance.version_id}")
    expect(body).to_contain_text("lithi/trigger: newer_manifest")
    expect(body).to_contain_text("Success")
    _shot(page, "runs_by_version.png")


# An event in the Events tab's list is named by its timestamp (e.g. "Dec 3, 11:17 AM"); the open
# event repeats its timestamp as the heading on the right, after the list.
EVENT_TIME = re.compile(r"^[A-Z][a-z]{2} \d{1,2}, \d{1,2}:\d{2} [AP]M$")


def _open_event(page, index: int) -> None:
    """Open the index-th event of the list (0 is the newest)."""
    from playwright.sync_api import expect

    times = page.get_by_text(EVENT_TIME)
    expect(times.nth(index + 1)).to_be_visible()  # the list holds it (plus the open heading)
    times.nth(index).click()


def test_compute_versions_events_show_the_partial_version_and_the_resubmission(
    page, webserver, lineage_instance
):
    from playwright.sync_api import expect

    page.goto(f"{webserver}/assets/compute_versions?view=events")
    body = page.locator("body")
    # The newest is open: the complete version, its parent, and what the resubmission changed.
    expect(body).to_contain_text(f"SUCCEEDED {lineage_instance.version_id}")
    expect(body).to_contain_text(lineage_instance.partial_version_id)  # as its parent
    expect(body).to_contain_text(re.compile(r"accepted \+\d+, abstained \+\d+, outstanding -\d+"))
    _shot(page, "compute_versions_events.png")
    # The one before it: the PARTIAL version, with items still outstanding.
    _open_event(page, 1)
    expect(body).to_contain_text(f"PARTIAL {lineage_instance.partial_version_id}: first version")
    _shot(page, "compute_versions_partial.png")


def test_training_run_events_keep_the_checkpoint_of_each_version(page, webserver, lineage_instance):
    from playwright.sync_api import expect

    page.goto(f"{webserver}/assets/training_run?view=events")
    body = page.locator("body")
    expect(body).to_contain_text(f"Materialized in run {lineage_instance.run_id[:8]}")
    expect(body).to_contain_text(lineage_instance.version_id)
    _open_event(page, 1)
    expect(body).to_contain_text(f"Materialized in run {lineage_instance.partial_run_id[:8]}")
    expect(body).to_contain_text(lineage_instance.partial_version_id)
    expect(body).not_to_contain_text(lineage_instance.version_id)
    _shot(page, "training_run_older_checkpoint.png")
