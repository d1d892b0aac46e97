"""The package as a user installs it: a wheel built from the tree, installed outside the checkout.

Every Makefile target installs the project editable, so nothing else would notice a wheel that
leaves modules out. Here the wheel is built from the files a clone holds, installed into a fresh
virtual environment whose only view of the checkout is that wheel, and used there from another
directory: every module imports, the CLI verifies a bundle, the instance is prepared from the
packaged ``dagster.yaml`` and Dagster loads the definitions.

The fresh environment reuses this one's installed packages (a path file lists them), minus the
project's own editable install, and with torch's distribution record replaced by one of another
version (``2.11.0+cu130``, a CUDA build that cannot be installed here): pip then resolves the
wheel's requirements against "a GPU environment's torch" and must keep it.
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from resources.settings import REPO_ROOT
from tests.helpers.bundles import make_input
from tests.helpers.timing import limit

PACKAGES = ("pipeline", "assets", "resources")
#: A torch other than the pinned one, as a GPU environment would have it.
OTHER_TORCH = "2.11.0+cu130"


def _clone_files() -> list[str]:
    """The files a clone of this tree holds (tracked, or new and not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    )  # fmt: skip
    return [f for f in out.stdout.decode().split("\0") if f and (REPO_ROOT / f).is_file()]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=limit(540), **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Build the wheel from a copy of the clone's files and install it into a fresh venv."""
    root = tmp_path_factory.mktemp("packaging")
    files = _clone_files()
    src = root / "src"
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / f, src / f)
    dist = root / "dist"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(dist), str(src)],
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("lithi_train-*.whl")

    # This environment's packages, seen through links: everything but the project itself and
    # torch's distribution record, which is replaced by another version's.
    deps = root / "deps"
    deps.mkdir()
    for site_dir in site.getsitepackages():
        for entry in Path(site_dir).iterdir():
            name = entry.name.lower()
            project = name.startswith(("lithi_train", "__editable__")) or name in PACKAGES
            torch_record = name.startswith("torch-") and name.endswith(".dist-info")
            if not (project or torch_record or (deps / entry.name).exists()):
                (deps / entry.name).symlink_to(entry)
    record = deps / f"torch-{OTHER_TORCH}.dist-info"
    record.mkdir()
    (record / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {OTHER_TORCH}\n"
    )
    (record / "INSTALLER").write_text("pip\n")
    (record / "RECORD").write_text("")

    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).stdout.strip()
    (Path(purelib) / "deps.pth").write_text(f"{deps}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    report = root / "report.json"
    plan = _run([*pip, "install", "--dry-run", "--no-index", "--report", str(report), str(wheel)])
    install = _run([*pip, "install", "--no-index", str(wheel)])
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    return {
        "root": root,
        "files": files,
        "wheel": wheel,
        "venv": venv,
        "python": python,
        "plan": plan,
        "report": report,
        "purelib": Path(purelib),
    }


def _env(installed: dict, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{installed['venv'] / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def test_the_wheel_holds_every_module_and_the_instance_config(installed):
    expected = {f for f in installed["files"] if f.split("/")[0] in PACKAGES and f.endswith(".py")}
    expected.add("pipeline/defs/dagster.yaml")
    with zipfile.ZipFile(installed["wheel"]) as whl:
        names = set(whl.namelist())
    assert expected - names == set()
    tops = {n.split("/")[0] for n in names if not n.startswith("lithi_train-")}
    assert tops == set(PACKAGES), "the wheel holds nothing but the project's three packages"


def test_the_wheels_requirements_admit_another_torch_and_no_demo_package(installed):
    with zipfile.ZipFile(installed["wheel"]) as whl:
        (meta,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        headers = email.parser.Parser().parsestr(whl.read(meta).decode())
    requires = headers.get_all("Requires-Dist")
    runtime = [r for r in requires if "extra ==" not in r]
    (torch_req,) = [r for r in runtime if r.split(">")[0].split("=")[0].strip() == "torch"]
    assert "==" not in torch_req, torch_req
    assert not any(r.startswith("scikit-learn") for r in runtime), runtime
    assert any(r.startswith("scikit-learn") and 'extra == "demo"' in r for r in requires)


def test_pip_keeps_the_environments_torch(installed):
    plan = installed["plan"]
    assert plan.returncode == 0, plan.stderr[-3000:]
    report = json.loads(installed["report"].read_text())
    names = [item["metadata"]["name"] for item in report["install"]]
    assert names == ["lithi-train"], f"pip would also install {names}"
    seen = _run(
        [str(installed["python"]), "-c",
         "import importlib.metadata as m; print(m.version('torch'))"],
        cwd=installed["root"], env=_env(installed),
    )  # fmt: skip
    assert seen.stdout.strip() == OTHER_TORCH, seen.stderr


def test_every_module_imports_from_the_installed_package(installed):
    modules = sorted(
        f[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for f in installed["files"]
        if f.split("/")[0] in PACKAGES and f.endswith(".py")
    )
    # A __main__ module runs its program when imported: it is found, not imported.
    program = (
        "import importlib, importlib.util, json, sys\n"
        f"mods = {modules!r}\n"
        "files = {m: importlib.util.find_spec(m).origin if m.endswith('.__main__')\n"
        "         else importlib.import_module(m).__file__ for m in mods}\n"
        "print(json.dumps(files))\n"
    )
    home = installed["root"] / "imports"
    home.mkdir()
    out = _run(
        [str(installed["python"]), "-c", program],
        cwd=home,
        env=_env(installed, DAGSTER_HOME=str(home / "dg"), LITHI_HOME=str(home / "l")),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    files = json.loads(out.stdout.strip().splitlines()[-1])
    outside = {m: f for m, f in files.items() if not f.startswith(str(installed["purelib"]))}
    assert outside == {}, "imported from somewhere other than the installed wheel"
    assert len(files) == len(modules)


def test_the_cli_verifies_a_bundle_outside_the_checkout(installed, tmp_path):
    make_input(tmp_path / "bundle", n=40, rows_per_part=15)
    cli = str(installed["venv"] / "bin" / "lithi-bundle")
    helped = _run([cli, "--help"], cwd=tmp_path, env=_env(installed))
    assert helped.returncode == 0, helped.stderr
    assert "verify" in helped.stdout
    verified = _run([cli, "verify", str(tmp_path / "bundle")], cwd=tmp_path, env=_env(installed))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_dagster_loads_the_installed_definitions_on_an_instance_it_prepares(installed, tmp_path):
    env = _env(installed, DAGSTER_HOME=str(tmp_path / "dagster_home"), LITHI_HOME=str(tmp_path))
    python = str(installed["python"])
    prepared = _run([python, "-m", "pipeline.defs.instance"], cwd=tmp_path, env=env)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    config = (tmp_path / "dagster_home" / "dagster.yaml").read_text()
    assert "telemetry:\n  enabled: false" in config
    validated = _run(
        [python, "-m", "dagster", "definitions", "validate", "-m", "pipeline.defs.definitions"],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert validated.returncode == 0, validated.stdout[-3000:] + validated.stderr[-3000:]
