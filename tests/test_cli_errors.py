"""How the console scripts fail: one line naming the program and the bad value, a traceback only for a bug or with
HYDRA_FULL_ERROR=1; robotrl-eval checks its run before Hydra creates anything under it."""

import os
import subprocess
import sys

import pytest
from helpers import REPO, run_module

from robotrl.cli_errors import ReportedError, exits_on_error, is_expected, reports_errors


def test_eval_of_a_missing_run_names_it_and_creates_nothing(tmp_path):
    missing = tmp_path / "no_such_run"
    proc = run_module("robotrl.eval", f"run={missing}", check=False, timeout=60, process=True)
    assert proc.returncode != 0
    assert f"robotrl-eval: error: run={str(missing)!r}: {missing} does not exist" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not missing.exists()


def test_eval_of_a_directory_that_is_no_run_names_its_missing_config_and_writes_nothing(tmp_path):
    proc = run_module("robotrl.eval", f"run={tmp_path}", check=False, timeout=60, process=True)
    assert proc.returncode != 0 and f"{tmp_path / 'config.yaml'} does not exist" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_hydra_full_error_shows_the_traceback_before_and_inside_hydra(tmp_path):
    (tmp_path / "config.yaml").write_text("{}\n")
    env = dict(os.environ, MUJOCO_GL="egl", HYDRA_FULL_ERROR="1")
    for module, args, bad in (
        ("robotrl.train", [f"resume={tmp_path / 'no_such_run'}"], "no_such_run"),  # checked before Hydra starts
        ("robotrl.eval", [f"run={tmp_path}", "episodes=0", f"hydra.run.dir={tmp_path / 'out'}"], "got 0"),  # inside
    ):
        proc = subprocess.run(
            [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode != 0 and "Traceback" in proc.stderr and bad in proc.stderr, proc.stderr


def test_expected_errors_become_one_line_and_bugs_keep_their_type(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    @reports_errors("robotrl-demo")
    def bad_value(cfg):
        raise ValueError(f"episodes must be >= 1, got {cfg}\n(a second line)")

    @reports_errors("robotrl-demo")
    def bug(cfg):
        return cfg.missing_attribute

    with pytest.raises(ReportedError) as err:
        bad_value(0)
    assert str(err.value) == "robotrl-demo: error: episodes must be >= 1, got 0; (a second line)"
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match="got 0"):  # the original, with its own traceback
        bad_value(0)
    with pytest.raises(AttributeError):
        bug(0)
    assert is_expected(FileNotFoundError("x")) and not is_expected(TypeError("x")) and not is_expected(KeyError("x"))


def test_an_error_before_hydra_prints_its_line_and_exits_1(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop, exits_on_error("robotrl-demo"):
        raise FileNotFoundError("resume='runs/x': runs/x/config.yaml does not exist")
    assert stop.value.code == 1
    assert capsys.readouterr().err == "robotrl-demo: error: resume='runs/x': runs/x/config.yaml does not exist\n"
    with pytest.raises(TypeError), exits_on_error("robotrl-demo"):
        raise TypeError("a bug")
