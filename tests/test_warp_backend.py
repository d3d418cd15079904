"""The MuJoCo Warp backend against the MuJoCo backend: open-loop trajectories, queries on the same states, the
scripted experts, per-env physical parameters, frames and bad input.

Skipped where mujoco-warp is not installed: `pip install -e ".[warp]"`. The first scene of a fresh machine compiles
warp's kernels (~55 s on 2 cores, each further scene ~5 s; cached under ~/.cache/warp), so the scenes here are
built in one process, panda_pick_cube's module-scoped. Measured on 2 shared cores, 2026-11-29: the whole file takes
75 s with an empty kernel cache (WARP_CACHE_PATH set to a new folder), 23 s with a warm one.
"""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from robotrl.sim2real.randomization import RandomizationConfig
from robotrl.tasks import SIM_TASKS, TASK_CONFIGS, make_task
from robotrl.tasks.arm_task import ASSETS, TaskVecEnv
from robotrl.tasks.expert_rollout import roll_out_expert

from robotrl.runtime.assembly import add_randomization

pytest.importorskip("mujoco_warp", reason='needs the warp extra: pip install -e ".[warp]"')

BACKENDS = ("mujoco", "mujoco_warp")
# Measured: 100 control steps (2000 physics steps) of a smooth joint-target sequence, the gripper open then closing,
# from the same resets keep every arm and finger joint within 2.1e-6 rad of the MuJoCo backend's (the resting cube
# within 1e-8 m): float32 against float64. The tolerance leaves 50x that for other seeds and devices.
PARITY_TOLERANCE_RAD = 1e-4
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _task(name, backend, num_envs, **kw):
    return make_task(TASK_CONFIGS[name](name=name, backend=backend, **kw), num_envs)


@pytest.fixture(scope="module")
def pick():
    """panda_pick_cube on both backends, 4 envs each."""
    envs = {backend: TaskVecEnv(_task("panda_pick_cube", backend, 4)) for backend in BACKENDS}
    yield envs
    for env in envs.values():
        env.close()


def test_a_missing_install_names_the_extra(monkeypatch):
    from robotrl.tasks.warp_backend import import_warp

    monkeypatch.setitem(sys.modules, "mujoco_warp", None)  # as if not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[warp\]"'):
        import_warp()


def test_the_memory_estimate_covers_the_largest_measured_scene():
    """hand_reorient grew resident memory by 0.44 MB per env on MuJoCo Warp (256 to 1024 envs, CPU): the estimate that
    guards num_envs must not be below it, for that scene or any other shipped one (tasks/memory.py)."""
    from robotrl.tasks.memory import FIXED, MB, bytes_needed

    for name in sorted(SIM_TASKS):
        per_env = (bytes_needed("mujoco_warp", ASSETS / f"{name}.xml", 1000) - FIXED["mujoco_warp"]) / 1000
        assert per_env >= 0.44 * MB, name


@pytest.mark.parametrize("name", ["panda_pick_cube", "panda_reach"])
def test_open_loop_joint_trajectories_agree_with_mujoco(name):
    trajectories = {}
    for backend in BACKENDS:
        task = _task(name, backend, 3)
        task.generator.manual_seed(0)
        task.reset(torch.arange(3))  # the same starts: the task draws them
        sim = task.backend
        joints = task.robot.joints + (task.robot.gripper.joints if task.has_gripper else ())
        start = sim.joint_pos(task.robot.joints).cpu()
        shape = torch.tensor([1.0, 0.5, -1.0, 0.5, 1.0, -0.5, 1.0]) * torch.tensor([[1.0], [0.7], [-0.8]])
        steps = []
        for k in range(100):
            targets = start + 0.3 * math.sin(math.pi * 0.04 * k) * shape
            if task.has_gripper:  # open, then closing on nothing from halfway
                targets = torch.cat([targets, torch.full((3, 1), 0.04 if k < 50 else 0.0)], 1)
            sim.set_actuators(task.commanded_actuators, targets)
            sim.step(20)
            steps.append(sim.joint_pos(joints).cpu().double())
        trajectories[backend] = torch.stack(steps)
        if task.has_gripper:
            trajectories[f"{backend} cube"] = sim.body_pose("cube")[0].cpu().double()
        sim.close()
    mujoco_q, warp_q = trajectories["mujoco"], trajectories["mujoco_warp"]
    assert (mujoco_q - mujoco_q[0]).abs().max() > 0.25  # the sequence moves the arm
    assert (warp_q - mujoco_q).abs().max() < PARITY_TOLERANCE_RAD
    if name == "panda_pick_cube":
        assert (trajectories["mujoco cube"] - trajectories["mujoco_warp cube"]).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["panda_reach", "panda_push", "panda_pick_cube", "panda_peg_insert"])
def test_scripted_expert_succeeds_as_on_mujoco(name):
    """10 episodes (one batch of 10 envs) from the same seed on each backend: measured 10 of 10 on both for every
    task, and the deepest contacts within 0.5 mm of each other's (peg_insert: 1.6 mm on MuJoCo Warp, 2.1 on MuJoCo)."""
    mujoco, warp = (roll_out_expert(TASK_CONFIGS[name](name=name, backend=b), 10, seed=0) for b in BACKENDS)
    assert not warp.diverged and warp.success_rate >= 0.9
    assert abs(warp.success_rate - mujoco.success_rate) <= 0.1
    assert abs(warp.deepest_penetration_m - mujoco.deepest_penetration_m) < 1e-3


def _set_states(env, cube_pos, cube_quat) -> None:
    """Arm poses near home (a different one per env) held by the actuators, open fingers, and the cube at `cube_pos`
    [4, 3]."""
    task, sim = env.task, env.task.backend
    ids = torch.arange(4)
    arm = task.robot.home.cpu() + torch.linspace(-0.3, 0.3, 4)[:, None] * torch.tensor([1.0, 0.5, -1, 0.3, 1, 0.5, -1])
    sim.set_joint_state(ids, task.robot.joints, arm)
    sim.set_joint_state(ids, task.robot.gripper.joints, torch.full((4, 2), 0.04))
    sim.set_actuators(task.commanded_actuators, torch.cat([arm, torch.full((4, 1), 0.04)], 1))
    sim.set_free_body_pose(ids, "cube", cube_pos, cube_quat)
    sim.forward()


def _grip_states(env) -> tuple[torch.Tensor, torch.Tensor]:
    """Cube poses: env 0 resting 0.5 mm deep in the floor, env 1 in the air, env 2 between the open pads (touching
    neither), env 3 turned 45 degrees onto an edge, 0.3 mm into the floor."""
    _set_states(env, torch.tensor([[0.5, 0.0, 0.0195]] * 4), torch.tensor([[1.0, 0, 0, 0]] * 4))
    grip, turn = (t.cpu() for t in env.task.backend.site_pose("grip_site"))
    pos = torch.tensor([[0.5, 0.0, 0.0195], [0.5, 0.1, 0.3], [0.0, 0.0, 0.0], [0.45, -0.1, 0.028]])
    pos[2] = grip[2]
    quat = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [1.0, 0, 0, 0], [0.9239, 0.3827, 0, 0]])
    quat[2] = turn[2]
    return pos, quat


def test_queries_on_the_same_states_agree_with_mujoco(pick):
    pos, quat = _grip_states(pick["mujoco"])
    results = {}
    for backend, env in pick.items():
        _set_states(env, pos, quat)
        sim = env.task.backend
        results[backend] = {
            "site": sim.site_pose("grip_site"),
            "bodies": [sim.body_pose(body) for body in ("hand", "link4", "cube", "left_finger")],
            "jacobian": sim.site_jacobian("grip_site", env.task.robot.joints + env.task.robot.gripper.joints),
            "cube on floor": sim.in_contact(("cube",), ("floor",)),
            "pads on cube": sim.in_contact(("left_pad", "right_pad"), ("cube",)),
            "depth": sim.deepest_penetration(),
        }
        # closed on the cube in env 2 (each pad 2 mm into it); contacts after one step
        sim.set_joint_state(torch.tensor([2]), env.task.robot.gripper.joints, torch.full((1, 2), 0.018))
        sim.forward(torch.tensor([2]))
        results[backend]["pads closed"] = sim.in_contact(("left_pad", "right_pad"), ("cube",))
        sim.step(1)
        results[backend]["stepped"] = sim.in_contact(("cube",), ("floor",))
    mujoco, warp = results["mujoco"], results["mujoco_warp"]
    torch.testing.assert_close(warp["site"][0].cpu(), mujoco["site"][0], atol=1e-5, rtol=0)
    sign = torch.sign((warp["site"][1].cpu() * mujoco["site"][1]).sum(-1, keepdim=True))  # q and -q: one turn
    torch.testing.assert_close(warp["site"][1].cpu() * sign, mujoco["site"][1], atol=1e-5, rtol=0)
    for (warp_pos, warp_quat), (mujoco_pos, mujoco_quat) in zip(warp["bodies"], mujoco["bodies"], strict=True):
        torch.testing.assert_close(warp_pos.cpu(), mujoco_pos, atol=1e-5, rtol=0)
        torch.testing.assert_close(warp_quat.cpu(), mujoco_quat, atol=1e-5, rtol=0)
    assert warp["jacobian"].shape == (4, 6, 9)
    torch.testing.assert_close(warp["jacobian"].cpu(), mujoco["jacobian"], atol=1e-4, rtol=0)
    for key in ("cube on floor", "pads on cube", "pads closed", "stepped"):
        assert warp[key].tolist() == mujoco[key].tolist(), key
    assert mujoco["cube on floor"].tolist() == [True, False, False, True]
    assert mujoco["pads closed"].tolist() == [False, False, True, False]
    assert warp["depth"] == pytest.approx(mujoco["depth"], abs=1e-5)


def test_a_subset_reset_leaves_the_other_envs_untouched(pick):
    env = pick["mujoco_warp"]
    env.reset(seed=0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        env.step(torch.rand(4, env.action_dim, generator=generator) * 2 - 1)
    sim, joints = env.task.backend, env.task.robot.joints

    def queries() -> dict[str, torch.Tensor]:
        return {
            "q": sim.joint_pos(joints),
            "hand": sim.body_pose("hand")[0],
            "jacobian": sim.site_jacobian("grip_site", joints),
            "cube": sim.body_pose("cube")[0],
            "contact": sim.in_contact(("cube",), ("floor",)),
        }

    before = queries()
    ids = torch.tensor([1, 3])
    env.task.reset(ids)
    after = queries()
    kept = torch.tensor([0, 2])
    for key in before:  # the poses the last step left, not recomputed: as the MuJoCo backend's
        assert torch.equal(after[key][kept], before[key][kept]), key
    assert (after["q"][ids] - env.task.robot.home).abs().max() <= 0.05 + 1e-5
    assert not torch.equal(after["hand"][ids], before["hand"][ids])
    assert torch.equal(sim.joint_vel(joints)[ids], torch.zeros(2, len(joints)))


def _load_preset(name: str) -> RandomizationConfig:
    preset = OmegaConf.load(CONFIGS / "randomization" / f"{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RandomizationConfig), preset))


def test_randomized_physics_is_per_env_and_draws_as_on_mujoco():
    """The `wide` preset (masses, frictions, centres of mass, object sizes, joint and actuator properties, gravity)
    drawn from one seed: the same per-env values on both backends, which MuJoCo Warp runs with (read back), and each
    env then steps as the MuJoCo backend's env with the same values, the same actions."""
    envs = {backend: TaskVecEnv(_task("panda_pick_cube", backend, 3)) for backend in BACKENDS}
    drawn = {backend: add_randomization(env, _load_preset("wide"), seed=5) for backend, env in envs.items()}
    for env in envs.values():
        env.reset(seed=0)
    mujoco_values, warp_values = drawn["mujoco"].values(), drawn["mujoco_warp"].values()
    assert "object_size" in warp_values
    for key, values in mujoco_values.items():
        assert not torch.equal(values[0], values[1]), key
        assert torch.equal(warp_values[key], values), key
    sim = envs["mujoco_warp"].task.backend
    for term in drawn["mujoco_warp"].terms:
        simulated = sim.physics(term.term.param, term.names).cpu().double()
        torch.testing.assert_close(simulated, term.values, rtol=1e-6, atol=1e-6, msg=term.key)
    generator = torch.Generator().manual_seed(1)
    actions = torch.rand(10, 3, envs["mujoco"].action_dim, generator=generator) * 2 - 1
    for action in actions:
        results = {backend: env.step(action).next_obs for backend, env in envs.items()}
    # measured after the 10th step: 1.7e-6 rad and 2.4e-6 m (the cube differed by 4e-5 m while it settled onto the
    # table in the first step, from a contact distance of 0)
    for key in ("arm_qpos", "cube_pos"):
        torch.testing.assert_close(results["mujoco_warp"][key], results["mujoco"][key], atol=1e-4, rtol=0, msg=key)
    for env in envs.values():
        env.close()


def test_written_masses_and_armatures_act_as_in_a_c_model_with_those_values(pick):
    """Each env gets its own change; the constants MuJoCo derives from them (mj_setConst on a C model, which equals a
    fresh compile: tests/test_randomization.py) and 100 physics steps of each env match the MuJoCo backend given the
    same writes; the envs not written keep their own constants."""
    import warp as wp

    changes = [
        (torch.tensor([0]), "body_mass", ["link7", "hand"], torch.tensor([[2.5, 2.0]])),
        (torch.tensor([1]), "joint_armature", ["joint2", "joint4"], torch.tensor([[0.8, 0.5]])),
        (torch.tensor([2]), "body_com", ["link6"], torch.tensor([[[0.05, 0.02, -0.01]]])),
        (torch.tensor([3]), "joint_damping", ["joint1"], torch.tensor([[40.0]])),
        (torch.tensor([3]), "gravity", ["world"], torch.tensor([[[0.5, 0.0, -6.0]]])),
    ]
    final, constants = {}, {}
    derived = ("body_subtreemass", "dof_invweight0", "body_invweight0", "actuator_acc0")
    for backend, env in pick.items():
        sim = env.task.backend
        nominal = {param: sim.physics(param, names).cpu() for _, param, names, _ in changes}
        for env_ids, param, names, values in changes:
            sim.set_physics(param, env_ids, names, values)
        if backend == "mujoco":
            constants[backend] = {name: np.stack([getattr(m, name) for m in sim.models]) for name in derived}
        else:
            constants[backend] = {name: wp.to_torch(getattr(sim.m, name)).cpu().numpy().copy() for name in derived}
        _set_states(env, torch.tensor([[0.5, 0.3, 0.0195]] * 4), torch.tensor([[1.0, 0, 0, 0]] * 4))  # out of reach
        sim.set_actuators(env.task.arm_actuators, sim.joint_pos(env.task.robot.joints).cpu() + 0.2)
        for _ in range(5):
            sim.step(20)
        final[backend] = sim.joint_pos(env.task.robot.joints).cpu()
        for env_ids, param, names, _ in changes:  # back to nominal for the other tests
            sim.set_physics(param, env_ids, names, nominal[param][env_ids])
    for name in derived:
        c_values, warp_values = constants["mujoco"][name], constants["mujoco_warp"][name]
        np.testing.assert_allclose(warp_values.reshape(c_values.shape), c_values, rtol=2e-5, atol=1e-6, err_msg=name)
    assert not np.allclose(constants["mujoco"]["body_subtreemass"][0], constants["mujoco"]["body_subtreemass"][3])
    # measured: within 5e-7 rad in every env, each env 0.1 to 0.65 rad from the nominal env's joints
    torch.testing.assert_close(final["mujoco_warp"], final["mujoco"], atol=2e-5, rtol=0)
    assert (final["mujoco"][:3] - final["mujoco"][3]).abs().amax(1).min() > 0.05


def test_a_resized_cube_rests_at_its_size_as_on_mujoco(pick):
    heights = {}
    for backend, env in pick.items():
        sim, ids = env.task.backend, torch.arange(4)
        sizes = torch.tensor([[0.8], [1.0], [1.25], [1.1]])
        sim.set_physics("body_size", ids, ["cube"], sizes)
        _set_states(env, torch.tensor([[0.5, 0.0, 0.05]] * 4), torch.tensor([[1.0, 0, 0, 0]] * 4))
        for _ in range(10):
            sim.step(20)
        sim.forward()
        heights[backend] = sim.body_pose("cube")[0][:, 2].cpu()
        torch.testing.assert_close(sim.physics("body_size", ["cube"]).cpu(), sizes)
        sim.set_physics("body_size", ids, ["cube"], torch.ones(4, 1))
    torch.testing.assert_close(heights["mujoco_warp"], heights["mujoco"], atol=1e-4, rtol=0)
    torch.testing.assert_close(heights["mujoco_warp"], 0.02 * torch.tensor([0.8, 1.0, 1.25, 1.1]), atol=1e-3, rtol=0)


def test_frames_equal_the_mujoco_backends(pick):
    """The same state and the same camera randomization (env 1's field of view), tints (env 3's cube) and sizes (env
    2's cube, resized before and after the first frame): the same pictures."""
    pos, quat = _grip_states(pick["mujoco"])
    frames = {}
    for backend, env in pick.items():
        sim = env.task.backend
        _set_states(env, pos, quat)
        sim.set_physics("camera_fovy", torch.tensor([1]), ["front"], torch.tensor([[60.0]]))
        sim.set_physics("body_size", torch.tensor([2]), ["cube"], torch.tensor([[1.4]]))
        first = sim.render("front", 96, 64)
        sim.set_physics("rgb_tint", torch.tensor([3]), ["cube"], torch.tensor([[[0.2, 1.0, 1.0]]]))
        sim.set_physics("body_size", torch.tensor([2]), ["cube"], torch.tensor([[0.7]]))
        frames[backend] = torch.stack([first, sim.render("front", 96, 64)]).cpu()
        assert sim.physics("camera_fovy", ["front"]).cpu()[:, 0].tolist() == [45.0, 60.0, 45.0, 45.0]
        sim.set_physics("camera_fovy", torch.tensor([1]), ["front"], torch.tensor([[45.0]]))
        sim.set_physics("rgb_tint", torch.tensor([3]), ["cube"], torch.ones(1, 1, 3))
        sim.set_physics("body_size", torch.tensor([2]), ["cube"], torch.ones(1, 1))
    warp, mujoco = frames["mujoco_warp"], frames["mujoco"]
    assert warp.shape == (2, 4, 64, 96, 3) and warp.dtype == torch.uint8
    differ = (warp.int() - mujoco.int()).abs().amax(-1) > 0
    assert differ.float().mean() < 1e-3  # measured: 1 pixel of 24576 by 1/255 (float32 poses)
    assert not torch.equal(mujoco[0, 1], mujoco[0, 0]) and not torch.equal(mujoco[1, 3], mujoco[0, 3])
    assert not torch.equal(mujoco[0, 2], mujoco[1, 2])  # the cube's size shows


def test_bad_input_is_refused_naming_it(pick):
    sim, ids = pick["mujoco_warp"].task.backend, torch.arange(1)
    with pytest.raises(KeyError, match="joint 'elbow'"):
        sim.joint_pos(("elbow",))
    with pytest.raises(ValueError, match="joint 'cube_joint' is not a hinge or slide joint"):
        sim.set_joint_state(ids, ("cube_joint",), torch.zeros(1, 1))
    with pytest.raises(KeyError, match="body 'mug'"):
        sim.body_pose("mug")
    with pytest.raises(ValueError, match="body 'hand' has no free joint"):
        sim.set_free_body_pose(ids, "hand", torch.zeros(1, 3), torch.tensor([[1.0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="body 'cube' is not a mocap body"):
        sim.set_mocap_pose(ids, "cube", torch.zeros(1, 3))
    with pytest.raises(KeyError, match="actuator 'thruster'"):
        sim.set_actuators(("thruster",), torch.zeros(4, 1))
    with pytest.raises(KeyError, match="geom 'lid'"):
        sim.in_contact(("lid",), ("cube",))
    with pytest.raises(ValueError, match="unknown physics parameter 'colour'"):
        sim.physics("colour", ["cube"])
    with pytest.raises(ValueError, match=r"body_mass of \['cube'\] must be > 0"):
        sim.set_physics("body_mass", ids, ["cube"], torch.zeros(1, 1))
    with pytest.raises(ValueError, match="body_size: body 'world' has a mesh, height field or plane geom"):
        sim.set_physics("body_size", ids, ["world"], torch.ones(1, 1))


def test_a_diverged_env_and_an_overflow_are_named():
    from robotrl.tasks.warp_backend import MujocoWarpBackend

    sim = MujocoWarpBackend(ASSETS / "panda_reach.xml", num_envs=3)
    sim.set_joint_state(torch.tensor([2]), ("joint1",), torch.tensor([[float("nan")]]))
    with pytest.raises(FloatingPointError, match="env 2 diverged"):
        sim.step(1)
    crowded = MujocoWarpBackend(ASSETS / "panda_pick_cube.xml", num_envs=2, nconmax=3)
    ids = torch.arange(2)
    crowded.set_free_body_pose(ids, "cube", torch.tensor([[0.5, 0, 0.019]] * 2), torch.tensor([[1.0, 0, 0, 0]] * 2))
    crowded.forward()  # 4 contacts each with the floor
    with pytest.raises(RuntimeError, match=r"env 0, 1 .* raise MujocoWarpBackend's nconmax=3 \(contacts\)"):
        crowded.step(1)


def test_a_short_training_run_selects_and_trains_on_mujoco_warp(tmp_path):
    """`robotrl-train backend=mujoco_warp num_envs=4`, shortened: SAC's updates on 4 batched envs, and the closing
    evaluation with its video, whose frames come from the backend's C copy of the scene."""
    from hydra import compose, initialize_config_module

    from robotrl.config import register_configs, to_train_config
    from robotrl.runtime.loop import train

    register_configs()
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "backend=mujoco_warp",
                "num_envs=4",
                "total_steps=200",
                "learning_starts=100",
                "eval_interval=200",
                "eval_episodes=1",
                "checkpoint_interval=100000",
                "agent.batch_size=32",
                "agent.actor_hidden=[32,32]",
                "agent.critic_hidden=[32,32]",
                "progress=false",
            ],
        )
    train_cfg = to_train_config(cfg)
    assert train_cfg.task.backend == "mujoco_warp"
    summary = train(train_cfg, tmp_path)
    assert summary["env_steps"] == 200 and summary["updates"] == 100 and "eval/success" in summary
    assert next((tmp_path / "videos").glob("*.mp4")).stat().st_size > 1000
