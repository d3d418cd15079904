"""The deploy spec (robotrl/core/deploy_spec.py): what each task declares matches what its simulated env
observes; robotrl-train and robotrl-learner write it into the run directory; loading a run for a robot imports
no simulator; a run from before specs gets one derived once; a bad or newer file is refused by name, and so is a
spec the robot config cannot serve, before anything moves. Domain ids: none (no robot env is built)."""

import json
import logging
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
import torch
from helpers import LEARNER_ARGS, TINY, LearnerProcess, free_port, run_module
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from robotrl.tasks import SIM_TASKS, deploy_spec_for, task_functions, write_deploy_spec_for_run
from robotrl.tasks.arm_task import ASSETS, SIM_TIMESTEP
from robotrl.tasks.configs import ArmTaskConfig, HandTaskConfig

from robotrl.agents import make_agent
from robotrl.config import register_configs, to_train_config
from robotrl.core.deploy_spec import (
    FILE_NAME,
    FORMAT_VERSION,
    DeploySpec,
    DeploySpecError,
    read_deploy_spec,
    write_deploy_spec,
)
from robotrl.runtime.checkpoint import save_checkpoint
from robotrl.runtime.loop import make_training_env

register_configs()


def _task(name: str, **settings):
    return (HandTaskConfig if name == "hand_reorient" else ArmTaskConfig)(name=name, **settings)


@pytest.mark.parametrize("name", sorted(SIM_TASKS))
def test_each_tasks_spec_observes_what_its_simulated_env_observes(name):
    """The spec is made from the task's class and config alone; its observation layout, action size, controller
    and episode length are the built env's, and it survives its own JSON."""
    cfg = _task(name)
    env = make_training_env(SimpleNamespace(task=cfg, agent=SimpleNamespace(frame_stack=1)), num_envs=1)
    try:
        spec = deploy_spec_for(cfg)
        assert spec.obs_spec() == dict(env.obs_spec) and spec.action_dim == env.action_dim
        task = env.task
        assert (spec.control, spec.episode_steps, spec.robot) == (
            task.controller.kind,
            task.episode_steps,
            task.robot.name,
        )
        assert spec.gripper_action == task.has_gripper and spec.score_reads == tuple(task.score_reads)
        assert spec.drawn_goals == tuple(task.drawn_goals) and set(spec.start_regions) == set(task.start_regions)
        assert spec.held.keys() == set(task.held_sites)
        assert spec.policy_rate_hz == pytest.approx(25.0)
    finally:
        env.close()
    assert DeploySpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_pixel_specs_stack_camera_frames_as_the_training_env_does():
    for obs in ("pixels", "state+pixels"):
        cfg = ArmTaskConfig(name="panda_reach", obs=obs, cameras=["front", "wrist"], image_size=64)
        env = make_training_env(SimpleNamespace(task=cfg, agent=SimpleNamespace(frame_stack=3)), num_envs=1)
        try:
            spec = deploy_spec_for(cfg, frame_stack=3, env=env)
            assert spec.obs_spec() == dict(env.obs_spec) and spec.frame_stack == 3
            assert spec.cameras == ("front", "wrist") and spec.image_size == 64
            assert not spec.scores_from_observations or obs == "state+pixels"
        finally:
            env.close()


def test_the_scenes_physics_step_is_the_one_the_policy_rate_assumes():
    for robot in ("panda.xml", "hand4.xml"):
        option = ET.parse(ASSETS / robot).getroot().find("option")
        assert float(option.get("timestep")) == SIM_TIMESTEP


def test_task_functions_score_and_draw_as_the_simulated_task_does():
    """A robot's score and goal draw come from the task's module by name, under the spec's settings: the same
    numbers as the task object built in simulation."""
    cfg = ArmTaskConfig(name="panda_push", reward="sparse", success_threshold=0.03)
    env = make_training_env(SimpleNamespace(task=cfg, agent=SimpleNamespace(frame_stack=1)), num_envs=1)
    try:
        obs = env.reset(seed=3)
        score, draw = task_functions(deploy_spec_for(cfg))
        for shift in (0.0, 0.02, 0.05):
            moved = {**obs, "goal": obs["puck_pos"][:, :2] + shift}
            assert [t.tolist() for t in score(moved)] == [t.tolist() for t in env.task.score(moved)]
        puck = {"puck": torch.tensor([[0.5, 0.0, 0.02]])}
        same = [
            env.task.draw_goals(1, puck, torch.Generator().manual_seed(7)),
            draw(1, puck, torch.Generator().manual_seed(7)),
        ]
        assert torch.equal(same[0]["goal"], same[1]["goal"])
    finally:
        env.close()
    assert task_functions(deploy_spec_for(ArmTaskConfig(name="panda_pick_cube"))) == (None, None)


# -- bad files ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reach_spec():
    return deploy_spec_for(ArmTaskConfig(name="panda_reach"))


def _broken(tmp_path, reach_spec, change) -> str:
    data = reach_spec.to_json()
    change(data)
    (tmp_path / FILE_NAME).write_text(json.dumps(data))
    with pytest.raises(DeploySpecError) as error:
        read_deploy_spec(tmp_path)
    assert str(error.value).startswith(f"{tmp_path / FILE_NAME}: ")
    return str(error.value)


def test_a_spec_file_that_is_not_a_whole_valid_spec_is_refused_naming_the_file_and_entry(tmp_path, reach_spec):
    (tmp_path / FILE_NAME).write_text('{"format_version": 1, "task": ')
    with pytest.raises(DeploySpecError, match=rf"^{tmp_path / FILE_NAME}: not valid JSON"):
        read_deploy_spec(tmp_path)
    assert "missing control" in _broken(tmp_path, reach_spec, lambda d: d.pop("control"))
    assert "missing observations.target.shape" in _broken(
        tmp_path, reach_spec, lambda d: d["observations"]["target"].pop("shape")
    )
    assert "unknown speed" in _broken(tmp_path, reach_spec, lambda d: d.update(speed=2))
    message = _broken(tmp_path, reach_spec, lambda d: d.update(episode_steps="50"))
    assert "episode_steps must be an integer, got '50'" in message
    message = _broken(tmp_path, reach_spec, lambda d: d["observations"]["to_target"].update(source="radar"))
    assert "observations.to_target.source must be one of" in message
    message = _broken(tmp_path, reach_spec, lambda d: d.update(control="torque"))
    assert "control must be one of ee_delta, joint_delta, joint_position, got 'torque'" in message
    message = _broken(tmp_path, reach_spec, lambda d: d["observations"]["target"].update(shape=[2]))
    assert "observations.to_target: goal 'target' has shape [2]" in message


def test_a_spec_from_a_newer_robotrl_is_refused(tmp_path, reach_spec):
    message = _broken(tmp_path, reach_spec, lambda d: d.update(format_version=FORMAT_VERSION + 1))
    assert f"format_version {FORMAT_VERSION + 1} is newer than this robotrl reads ({FORMAT_VERSION})" in message


# -- run directories ---------------------------------------------------------------------------------------
def _untrained_run(run, overrides: list[str], deploy_spec: bool = True):
    """config.yaml, a checkpoint and (unless `deploy_spec` is false: an older run) deploy_spec.json."""
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    OmegaConf.save(cfg, run / "config.yaml", resolve=True)
    train_cfg = to_train_config(cfg)
    spec = deploy_spec_for(train_cfg.task, getattr(train_cfg.agent, "frame_stack", 1))
    agent = make_agent(train_cfg.agent, spec.obs_spec(), spec.action_dim, torch.device("cpu"))
    save_checkpoint(run / "checkpoints", 10, agent, None, {"env_step": 10})
    if deploy_spec:
        write_deploy_spec_for_run(train_cfg.task, train_cfg.agent.frame_stack, run)
    return run


SMALL = ["agent.actor_hidden=[32,32]", "agent.critic_hidden=[32,32]"]

NO_SIMULATOR = textwrap.dedent(
    """
    import json, sys
    from robotrl.hardware.deployment import load_policy
    agent, spec, checkpoint = load_policy(sys.argv[1])
    print(json.dumps({"task": spec.task, "held": spec.held, "checkpoint": checkpoint,
                      "loaded": sorted(m for m in ("mujoco", "genesis") if m in sys.modules)}))
    """
)


def test_loading_a_run_for_a_robot_imports_no_simulator(tmp_path):
    """The spec and the policy of a run (peg_insert's, whose held point was measured in simulation when the run
    started) load in a fresh process with neither MuJoCo nor Genesis imported."""
    run = _untrained_run(tmp_path, ["task=panda_peg_insert", *SMALL])
    proc = subprocess.run(
        [sys.executable, "-c", NO_SIMULATOR, str(run)], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["task"] == "panda_peg_insert" and loaded["checkpoint"].endswith("10")
    assert loaded["held"]["peg_tip"] == pytest.approx([0.0, 0.0, 0.06], abs=1e-4)
    assert loaded["loaded"] == []


def test_a_run_from_before_deploy_specs_gets_one_derived_written_and_logged_once(tmp_path, caplog):
    from robotrl.hardware.deployment import load_policy

    run = _untrained_run(tmp_path, ["task=panda_peg_insert", *SMALL], deploy_spec=False)
    assert not (run / FILE_NAME).exists()
    with caplog.at_level(logging.INFO, logger="robotrl.hardware.deployment"):
        _, spec, _ = load_policy(run)
    assert any(
        "no deploy spec" in r.getMessage() and "derived it from config.yaml" in r.getMessage() for r in caplog.records
    )
    assert read_deploy_spec(run) == spec and spec.held["peg_tip"] == pytest.approx((0.0, 0.0, 0.06), abs=1e-4)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="robotrl.hardware.deployment"):
        load_policy(run)
    assert not caplog.records  # read this time


def test_deploy_refuses_a_run_whose_spec_is_bad_naming_the_file(tmp_path):
    run = _untrained_run(tmp_path, ["task=panda_reach", *SMALL])
    data = json.loads((run / FILE_NAME).read_text())
    data["frame_stack"] = 0
    (run / FILE_NAME).write_text(json.dumps(data))
    proc = run_module(
        "robotrl.hardware.deploy", f"run={run}", f"hydra.run.dir={tmp_path / 'h'}", check=False, timeout=60
    )
    assert proc.returncode != 0
    assert f"robotrl-deploy: error: {run / FILE_NAME}: frame_stack must be an integer >= 1, got 0" in proc.stderr
    data["frame_stack"], data["task"] = 1, "panda_push"
    (run / FILE_NAME).write_text(json.dumps(data))
    from robotrl.hardware.deployment import load_policy

    with pytest.raises(DeploySpecError, match=r"its task is 'panda_push', the run's config.yaml trains 'panda_reach'"):
        load_policy(run)


# -- a spec the robot config cannot serve --------------------------------------------------------------------
@pytest.fixture
def no_robot_env(monkeypatch):
    """deploy.RobotEnv replaced by a trap: a refusal must come before a robot env (its bridge, its commands)."""
    pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
    from robotrl.hardware import deploy

    def trap(*args, **kwargs):
        raise AssertionError("a robot env was built")

    monkeypatch.setattr(deploy, "RobotEnv", trap)
    return deploy


def test_a_spec_the_robot_config_cannot_serve_is_refused_by_entry_before_a_robot_env_exists(no_robot_env, tmp_path):
    from robotrl.hardware.robot_env import RobotEnvConfig

    deploy = no_robot_env
    pixels = deploy_spec_for(ArmTaskConfig(name="panda_reach", obs="pixels", cameras=["wrist"], image_size=64))
    with pytest.raises(
        ValueError,
        match=r"observes \['pixels_wrist'\] from cameras \['wrist'\], which hardware.cameras \['front'\] lacks",
    ):
        deploy.make_robot_env(RobotEnvConfig(cameras=["front"]), pixels)
    push = deploy_spec_for(ArmTaskConfig(name="panda_push"))
    with pytest.raises(ValueError, match=r"observes \['puck_pos', 'puck_to_goal', 'to_puck'\].*track \['puck'\]"):
        deploy.make_robot_env(RobotEnvConfig(objects=["cube"]), push)
    with pytest.raises(ValueError, match=r"trained for robot 'panda', hardware.robot is 'hand4'"):
        deploy.make_robot_env(RobotEnvConfig(robot="hand4"), push)
    hand = deploy_spec_for(HandTaskConfig(name="hand_reorient"))
    ee_on_hand = DeploySpec(
        **{
            **hand.__dict__,
            "control": "ee_delta",
            "action_dim": 3,
            "action_low": (-1.0,) * 3,
            "action_high": (1.0,) * 3,
        }
    )
    with pytest.raises(ValueError, match=r"control=ee_delta; robot 'hand4' does not offer it"):
        deploy.make_robot_env(RobotEnvConfig(robot="hand4"), ee_on_hand)
    pick = deploy_spec_for(ArmTaskConfig(name="panda_pick_cube"))
    with pytest.raises(ValueError, match=r"moves the gripper .*hardware.gripper_controller is empty"):
        deploy.make_robot_env(RobotEnvConfig(gripper_controller="", objects=["cube"]), pick)
    with pytest.raises(
        ValueError,
        match=r"observes \['cube_pos', 'cube_quat', 'cube_to_goal', 'goal_quat'\], which the robot does not measure: "
        r"track \['cube'\] with hardware.objects=\[cube\] .*give \+goal.goal_quat=\[w,x,y,z\]",
    ):
        deploy.make_robot_env(RobotEnvConfig(robot="hand4"), hand)  # the hand's own state it measures: not named
    # robotrl-deploy itself: refused by entry (one line) with nothing built
    run = _untrained_run(tmp_path, ["task=panda_push", *SMALL])
    with pytest.raises(ValueError, match=r"track \['puck'\] with hardware.objects=\[puck\]"):
        deploy.run(deploy.DeployConfig(run=str(run), hardware=RobotEnvConfig()))


# -- the programs that start runs write it -----------------------------------------------------------------
def test_train_writes_the_deploy_spec_when_the_run_starts(tmp_path):
    run = tmp_path / "run"
    run_module(
        "robotrl.train",
        *[a for a in TINY if not a.startswith(("task", "total_steps", "learning_starts", "progress"))],
        "task=panda_reach",
        "total_steps=60",
        "learning_starts=50",
        "video=false",
        "progress=false",
        f"hydra.run.dir={run}",
        timeout=300,
    )
    spec = read_deploy_spec(run)
    assert spec.task == "panda_reach" and spec.drawn_goals == ("target",)


def test_the_learner_writes_the_deploy_spec_when_it_starts(tmp_path):
    base = [a for a in LEARNER_ARGS if not a.startswith("task")]
    learner = LearnerProcess(tmp_path / "learner", free_port(), base=[*base, "task=panda_pick_cube"])
    try:  # written before it serves
        spec = read_deploy_spec(tmp_path / "learner")
    finally:
        learner.stop()
    assert spec.task == "panda_pick_cube" and spec.gripper_action and not spec.scores_from_observations


def test_write_deploy_spec_is_atomic_and_validates(tmp_path, reach_spec):
    path = write_deploy_spec(reach_spec, tmp_path)
    assert read_deploy_spec(path) == reach_spec and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(DeploySpecError, match="frame_stack must be an integer >= 1"):
        write_deploy_spec(DeploySpec(**{**reach_spec.__dict__, "frame_stack": 0}), tmp_path)
    assert read_deploy_spec(path) == reach_spec  # the old file stays whole
