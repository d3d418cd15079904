"""The distribution a user installs: a wheel built from this tree carries every module and data file (MJCF
assets, Hydra configs, robot specs), builds without setuptools' warnings, and runs a task from a venv that has
only the wheel, not the source tree.

The wheel is built from a copy of the tree, so the checkout's build/ and *.egg-info stay untouched (setuptools
builds in build/lib, where stale files from an earlier build would leak into a wheel). The venv takes torch,
mujoco and Hydra from the running environment through a .pth line: `venv --system-site-packages` would give it
the base interpreter's site-packages, not this venv's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each top-level directory and where the wheel puts it (pyproject.toml's package-dir).
PACKAGE_DIRS = {
    "robotrl": "robotrl",
    "tasks": "robotrl/tasks",
    "hardware": "robotrl/hardware",
    "sim2real": "robotrl/sim2real",
    "configs": "robotrl/configs",
}
# What a build must not say: setuptools' notices about package data it would drop or handle in a deprecated way,
# and any other warning of the build backend.
ALARMS = ("Python recognizes", "as data is deprecated", "absent from the `packages`", "Warning", "deprecated")


def _copy_sources(dest: Path) -> Path:
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in PACKAGE_DIRS:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    return _copy_sources(tmp_path_factory.mktemp("packaging") / "src")


@pytest.fixture(scope="module")
def built(sources) -> tuple[Path, str]:
    """The wheel built from a copy of the tree, and what the build printed."""
    dist = sources.parent / "dist"
    out = subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), str(sources)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    (wheel,) = dist.glob("robotrl-*.whl")
    return wheel, log


def test_the_build_prints_no_warning(built):
    _, log = built
    alarms = [line for line in log.splitlines() if any(alarm in line for alarm in ALARMS)]
    assert not alarms, log


def test_the_wheel_carries_every_module_and_data_file(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {}
    for top, installed in PACKAGE_DIRS.items():
        for pattern in ("**/*.py", "**/*.yaml", "**/*.xml"):
            for path in (ROOT / top).glob(pattern):
                if "__pycache__" not in path.parts:
                    expected[str(path.relative_to(ROOT))] = f"{installed}/{path.relative_to(ROOT / top).as_posix()}"
    missing = sorted(source for source, name in expected.items() if name not in names)
    assert not missing, f"files the wheel lacks: {missing}"
    # the three kinds of data, named, so a glob that finds nothing cannot pass for a complete wheel
    assert "robotrl/tasks/assets/panda.xml" in names and "robotrl/tasks/assets/scene.xml" in names
    assert "robotrl/configs/config.yaml" in names and "robotrl/configs/task/panda_reach.yaml" in names
    assert "robotrl/core/robots/panda.yaml" in names


# Run by the venv's python, from a directory outside the tree: every import must come from the installed wheel.
SMOKE = """
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import robotrl, robotrl.configs, robotrl.tasks
from robotrl.config import register_configs
from robotrl.core.robot_spec import load_robot_spec
from robotrl.tasks import make_env

site = Path(sys.argv[1]).resolve()
for module in (robotrl, robotrl.configs, robotrl.tasks):
    assert Path(module.__file__).resolve().is_relative_to(site), module.__file__
register_configs()
with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
    cfg = compose("config", ["task=panda_reach"])
env = make_env(OmegaConf.to_object(cfg.task))
obs = env.reset(seed=0)
result = env.step(torch.zeros(1, env.action_dim))
assert result.reward.shape == (1,)
assert load_robot_spec("panda").name == "panda"
print("made", cfg.task.name, sorted(obs))
"""


def _venv(path: Path) -> tuple[Path, Path]:
    """A new venv at `path` that also sees the running env's packages: its python and its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    python = path / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # torch, mujoco and Hydra from the running env; a plain path line, so its editable robotrl stays inactive
    (site / "running_env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python, site


def test_an_editable_install_prints_no_warning_about_packages(sources, tmp_path):
    """What `make` runs on a fresh machine. setuptools still prints one notice, "Editable installation": a
    package-dir mapping is served by a meta path finder, and it says so for every such project."""
    python, _ = _venv(tmp_path / "venv")
    out = subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-deps", "--no-build-isolation", "--no-index", "-e", sources],
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    alarms = [line for line in log.splitlines() if any(alarm in line for alarm in ALARMS)]
    assert [line for line in alarms if "Editable installation" not in line] == [], log


def test_the_installed_wheel_makes_an_env_outside_the_tree(built, tmp_path):
    wheel, _ = built
    python, site = _venv(tmp_path / "venv")
    out = subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not any(alarm in out.stdout + out.stderr for alarm in ALARMS), out.stdout + out.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run = subprocess.run(
        [python, "-c", SMOKE, str(site)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "made panda_reach" in run.stdout
