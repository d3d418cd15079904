import gymnasium as gym
import numpy as np
import pytest
import torch
from robotrl.tasks import make_env, make_task
from robotrl.tasks.arm_task import TaskVecEnv
from robotrl.tasks.configs import ArmTaskConfig


def _env(num_envs=1, **kw):
    return TaskVecEnv(make_task(ArmTaskConfig(**kw), num_envs))


def test_reset_and_step_contract():
    env = _env(num_envs=3)
    obs = env.reset(seed=0)
    assert set(obs) == {"arm_qpos", "arm_qvel", "ee_pos", "target", "to_target"}
    for key, spec in env.obs_spec.items():
        assert obs[key].shape == (3, *spec.shape) and obs[key].dtype == torch.float32
    result = env.step(torch.zeros(3, 3))
    assert result.reward.shape == (3,) and result.success.dtype == torch.bool
    assert not result.terminated.any() and not result.truncated.any()
    for _ in range(env.task.episode_steps - 1):
        result = env.step(torch.zeros(3, 3))
    assert result.truncated.all()  # time limit at episode_steps
    assert not torch.equal(result.obs["target"], result.next_obs["target"])  # auto-reset drew new targets


def test_resets_are_deterministic_under_a_seed():
    a, b = _env(), _env()
    obs_a, obs_b = a.reset(seed=7), b.reset(seed=7)
    for key in obs_a:
        assert torch.equal(obs_a[key], obs_b[key])
    for _ in range(5):
        ra, rb = a.step(torch.full((1, 3), 0.3)), b.step(torch.full((1, 3), 0.3))
        assert torch.equal(ra.next_obs["ee_pos"], rb.next_obs["ee_pos"])
    assert not torch.equal(_env().reset(seed=8)["target"], obs_a["target"])


def test_success_is_detected_at_the_target_and_rewards_follow_the_variant():
    env = _env()
    env.reset(seed=1)
    task = env.task
    task.target[:] = task.ee_pos()  # put the target on the tool point
    reward, success, _ = task.evaluate()
    assert success.all() and reward.item() == pytest.approx(0.0, abs=1e-6)
    sparse = _env(reward="sparse")
    sparse.reset(seed=1)
    reward, success, _ = sparse.task.evaluate()
    assert not success.any() and reward.item() == -1.0


def test_ee_delta_controller_tracks_a_target_and_holds_orientation():
    env = _env()
    env.reset(seed=3)
    task = env.task
    _, start_quat = task.backend.site_pose(task.robot.end_effector_site)
    goal = task.ee_pos() + torch.tensor([[0.10, -0.08, -0.12]])
    for _ in range(25):
        delta = ((goal - task.ee_pos()) / task.cfg.max_ee_step).clamp(-1, 1)
        env.step(delta)
    assert (task.ee_pos() - goal).norm() < 0.01
    _, quat = task.backend.site_pose(task.robot.end_effector_site)
    assert torch.abs((quat * start_quat).sum()) > 0.999  # orientation within a couple of degrees


def test_relative_frame_rotates_actions_into_the_start_frame():
    env = _env(relative_frame=True)
    env.reset(seed=0)
    task = env.task
    before = task.ee_pos().clone()
    for _ in range(5):
        env.step(torch.tensor([[0.0, 0.0, 1.0]]))  # +z of the tool frame points down at home
    assert task.ee_pos()[0, 2] < before[0, 2] - 0.05


@pytest.mark.parametrize(
    ("setting", "match"),
    [
        ({"max_ee_step": -0.05}, "task.max_ee_step must be a finite number > 0, got -0.05"),
        ({"max_ee_step": 0.0}, "task.max_ee_step"),
        ({"max_joint_step": float("nan")}, "task.max_joint_step"),
        ({"success_threshold": -1.0}, "task.success_threshold"),
        ({"render_width": 0}, "task.render_width must be >= 1"),
        ({"relative_frame": True, "control": "joint_delta"}, "relative_frame=true rotates ee_delta.*joint_delta"),
    ],
)
def test_bad_task_settings_are_named(setting, match):
    with pytest.raises(ValueError, match=match):
        _env(**setting)


def test_pixel_observations_and_videos_keep_a_renderer_each():
    env = _env(obs="pixels", image_size=64, render_width=96, render_height=80)
    first = env.reset(seed=0)["pixels_front"].clone()
    assert env.render().shape == (80, 96, 3)
    again = env.reset(seed=0)["pixels_front"]
    assert torch.equal(first, again)  # the video renderer did not disturb the observation's
    assert sorted(env.task.backend._renderers) == [(64, 64), (96, 80)]  # neither rebuilt the other
    env.close()


def test_bad_actions_name_the_task_and_value():
    env = _env()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"panda_reach: action must have shape \[1, 3\]"):
        env.step(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="panda_reach: non-finite action"):
        env.step(torch.tensor([[0.0, float("nan"), 0.0]]))
    with pytest.raises(ValueError, match=r"panda_reach: action outside \[-1, 1\].*2\.0"):
        env.step(torch.tensor([[0.0, 2.0, 0.0]]))
    with pytest.raises(ValueError, match=r"task\.control"):
        _env(control="torque")
    with pytest.raises(ValueError, match=r"task\.backend"):
        _env(backend="isaac")


def test_gymnasium_registration_and_pixels_from_the_front_camera():
    env = gym.make("robotrl/PandaReach-v0")
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert not terminated and not truncated
    assert isinstance(reward, float) and "success" in info
    vec = make_env(ArmTaskConfig(render_width=96, render_height=64))
    vec.reset(seed=0)
    frame = vec.render()
    assert frame.shape == (64, 96, 3) and frame.dtype == np.uint8 and frame.std() > 5
    vec.close()


def test_pick_cube_success_needs_a_grasp_not_just_height():
    env = _env(name="panda_pick_cube")
    env.reset(seed=0)
    task = env.task
    # teleport the cube into the air, away from the fingers: high but not held
    task.backend.set_free_body_pose(
        torch.tensor([0]), "cube", torch.tensor([[0.5, 0.2, 0.3]]), torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    )
    task.backend.forward()
    _, success, _ = task.evaluate()
    assert not success.any()
    gym_env = gym.make("robotrl/PandaPickCube-v0")
    obs, _ = gym_env.reset(seed=0)
    assert obs["cube_pos"].shape == (3,) and gym_env.action_space.shape == (4,)


def test_pixel_observations_from_several_cameras_next_to_state():
    env = _env(name="panda_pick_cube", obs="state+pixels", cameras=["front", "wrist"], image_size=64)
    obs = env.reset(seed=0)
    for camera in ("front", "wrist"):
        image = obs[f"pixels_{camera}"]
        assert image.shape == (1, 3, 64, 64) and image.dtype == torch.uint8 and image.float().std() > 5
        assert env.obs_spec[f"pixels_{camera}"].shape == (3, 64, 64)
    assert "cube_pos" in obs
    result = env.step(torch.zeros(1, 4))
    assert result.next_obs["pixels_wrist"].shape == (1, 3, 64, 64)
    pixels_only = _env(obs="pixels", image_size=96)
    assert set(pixels_only.reset(seed=0)) == {"pixels_front"}
    gym_env = gym.make("robotrl/PandaPickCube-v0", obs="pixels")
    gym_obs, _ = gym_env.reset(seed=0)
    assert gym_env.observation_space.contains(gym_obs)
    with pytest.raises(ValueError, match=r"task\.image_size"):
        _env(obs="pixels", image_size=32)
    with pytest.raises(ValueError, match=r"task\.obs"):
        _env(obs="depth")


def test_a_diverged_simulation_is_reported_not_observed():
    env = _env()
    env.reset(seed=0)
    task = env.task
    nan_pose = torch.full((1, 7), float("nan"))
    task.backend.set_joint_state(torch.tensor([0]), task.robot.joints, nan_pose)
    with pytest.raises(FloatingPointError, match="non-finite joint targets"):
        env.step(torch.zeros(1, 3))  # the controller refuses to command from a NaN state
    task.backend.set_joint_state(torch.tensor([0]), task.robot.joints, nan_pose)
    with pytest.raises(FloatingPointError, match="env 0 diverged"):
        task.backend.step(1)  # and MuJoCo's silent reset is turned into an error


def test_joint_targets_stay_within_position_limits():
    env = _env(control="joint_delta")
    env.reset(seed=0)
    task = env.task
    robot, ids = task.robot, torch.tensor([0])
    for limit, push in ((robot.position_upper, 1.0), (robot.position_lower, -1.0)):
        near = limit - 0.01 * push  # one hundredth of a radian inside the limit, then push past it
        task.backend.set_joint_state(ids, robot.joints, near.unsqueeze(0))
        task.controller.reset(ids)
        target = task.controller.joint_targets(torch.full((1, 7), push))
        assert torch.allclose(target, limit.unsqueeze(0))


def test_task_math_follows_the_simulators_device():
    """A GPU backend returns state on its device and the task computes there; "meta" tensors (shapes only) stand in
    for a second device here: every limit vector of the robot spec moves, and the quaternion helpers' constants
    follow their inputs instead of staying on the CPU."""
    from robotrl.core.robot_spec import load_robot_spec
    from robotrl.core.rotations import quat_conjugate, quat_multiply, rotation_error

    spec = load_robot_spec("panda")
    moved = spec.to("meta")
    tensors = [name for name, value in vars(spec).items() if isinstance(value, torch.Tensor)]
    assert len(tensors) == 7 and all(getattr(moved, name).device.type == "meta" for name in tensors)
    assert moved.joints == spec.joints and moved.gripper == spec.gripper
    q = torch.empty(5, 4, device="meta")
    assert quat_multiply(q, quat_conjugate(q)).device.type == "meta"
    assert rotation_error(q, q).shape == (5, 3)
    task = make_task(ArmTaskConfig(name="panda_reach"), 2)
    assert task.device == torch.device("cpu") and task.robot.home.device.type == "cpu"


@pytest.mark.parametrize("name", ["panda_reach", "panda_push", "panda_peg_insert"])
@pytest.mark.parametrize("reward", ["dense", "sparse"])
def test_score_from_the_observation_is_the_reward_simulation_gives(name, reward):
    """A robot scores its episodes with `task.score(obs)` (hardware/robot_vec_env.py): it must be exactly what
    `evaluate` gives, over states the scripted expert reaches (successes included) and random ones."""
    env = _env(num_envs=8, name=name, reward=reward)
    task = env.task
    assert set(task.score_reads) <= set(task.obs_spec)
    env.reset(seed=3)
    successes = 0
    for step in range(100):  # random states first, then the expert's way to success
        action = task.expert_action() if step >= 8 else torch.rand(8, env.action_dim) * 2 - 1
        env.step(action)
        expected_reward, expected_success, _ = task.evaluate()
        reward_now, success_now = task.score(task.observe())
        torch.testing.assert_close(reward_now, expected_reward, rtol=0, atol=1e-6)
        assert torch.equal(success_now, expected_success)
        successes += int(success_now.sum())
    env.close()
    assert successes > 0, "no state scored a success: the comparison never covered one"


def test_a_task_whose_reward_needs_contacts_cannot_score_from_its_observation():
    env = _env(name="panda_pick_cube")
    env.reset(seed=0)
    assert env.task.score_reads == ()
    with pytest.raises(NotImplementedError, match="PandaPickCube's reward needs more than its observation holds"):
        env.task.score(env.task.observe())
    env.close()
