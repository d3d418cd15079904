"""gymnasium env ids from the packages that register them (tasks/gym_ids.py)."""

import subprocess
import sys
import textwrap

import pytest
from robotrl.tasks import make_env
from robotrl.tasks.configs import GymTaskConfig
from robotrl.tasks.gym_ids import resolve_env_id


def test_ids_of_gymnasium_robotics_resolve_in_a_process_that_never_imported_it():
    """gymnasium 1.x loads no plugins: the first make of a Fetch, Adroit, Shadow hand or Kitchen id imports the
    package that registers it."""
    pytest.importorskip("gymnasium_robotics")
    ids = ["FetchReach-v4", "AdroitHandDoor-v1", "HandManipulateBlock-v1", "FrankaKitchen-v1"]
    code = textwrap.dedent(
        f"""
        import sys, gymnasium
        from robotrl.tasks.gym_ids import resolve_env_id
        ids = {ids!r}
        assert "gymnasium_robotics" not in sys.modules and not any(i in gymnasium.registry for i in ids)
        print([resolve_env_id(i) for i in ids])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ids)


def test_a_module_colon_id_imports_the_module_that_registers_it(tmp_path, monkeypatch):
    (tmp_path / "robotrl_test_envs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('RobotrlColon-v0', entry_point='gymnasium.envs.classic_control:PendulumEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_env_id("robotrl_test_envs:RobotrlColon-v0") == "RobotrlColon-v0"
    env = make_env(GymTaskConfig(env_id="robotrl_test_envs:RobotrlColon-v0"))
    assert env.action_dim == 1
    with pytest.raises(ValueError, match=r"module 'robotrl_no_such_module' \(before the ':'\) cannot be imported"):
        resolve_env_id("robotrl_no_such_module:Anything-v0")


def test_an_id_found_nowhere_lists_close_matches():
    pytest.importorskip("gymnasium_robotics")
    with pytest.raises(ValueError, match=r"'FetchReech-v4' is not a registered.*gymnasium_robotics.*FetchReach-v4"):
        resolve_env_id("FetchReech-v4")
    with pytest.raises(ValueError, match=r"close matches: .*Pendulum-v1"):
        make_env(GymTaskConfig(env_id="Pendulm-v1"))
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match=r"task.env_id must be a gymnasium env id"):
            resolve_env_id(bad)
