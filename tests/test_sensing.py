"""The sensor model over real MuJoCo tasks: what the policy is shown is a past true observation that never goes
back in time, lost messages repeat the last one, bias and noise have their set size and keep one object's entries
consistent, and bad settings are refused."""

import pytest
import torch
from robotrl.sim2real.sensing import SensingConfig
from robotrl.tasks import TASK_CONFIGS, make_task
from robotrl.tasks.arm_task import TaskVecEnv

from robotrl.runtime.assembly import add_sensing


def _env(name="panda_reach", num_envs=3, **kw):
    return TaskVecEnv(make_task(TASK_CONFIGS[name](name=name, **kw), num_envs))


def _same_run(cfg: SensingConfig, steps: int, name="panda_reach", num_envs=3):
    """(true observations, shown observations) per step of two identical envs, one behind the sensor model."""
    plain, sensed = _env(name, num_envs), add_sensing(_env(name, num_envs), cfg, seed=0)
    true, shown = [plain.reset(seed=1)], [sensed.reset(seed=1)]
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        action = torch.rand(num_envs, plain.action_dim, generator=generator) * 2 - 1
        true.append(plain.step(action).next_obs)
        shown.append(sensed.step(action).next_obs)
    plain.close()
    sensed.close()
    return true, shown


def test_what_is_shown_is_a_past_observation_that_never_goes_back():
    """Delay drawn per step in 0..4 and a third of the messages lost: each shown observation equals a true one at
    most 4 steps old (or, lost, the one shown before), and its step never decreases, over many draws."""
    cfg = SensingConfig(delay_min=0, delay_max=4, delay_per="step", drop_prob=0.3)
    true, shown = _same_run(cfg, 45)  # within one 50-step episode
    lags = []
    for env in range(3):
        last = 0
        for t, obs in enumerate(shown):
            matches = [s for s in range(t + 1) if torch.equal(true[s]["arm_qpos"][env], obs["arm_qpos"][env])]
            assert matches, (env, t)
            step = max(matches)
            assert step >= last, f"env {env} was shown step {step} after step {last}"
            lags.append(t - step)
            last = step
    assert max(lags) > 4  # lost messages held an old observation past the longest delay
    assert sum(lag == 0 for lag in lags) > 5 and sum(1 <= lag <= 4 for lag in lags) > 30


def test_a_fixed_delay_shows_the_observation_of_k_steps_ago():
    true, shown = _same_run(SensingConfig(delay_min=2, delay_max=2), 10)
    for t in range(10):
        torch.testing.assert_close(shown[t]["ee_pos"], true[max(0, t - 2)]["ee_pos"], rtol=0, atol=0)


def test_bias_and_noise_have_their_size_and_one_object_stays_consistent():
    cfg = SensingConfig(joint_pos_bias=0.02, joint_pos_noise=0.005, object_pos_noise=0.01, object_pos_bias=0.0)
    true, shown = _same_run(cfg, 40, name="panda_push", num_envs=8)
    error = torch.stack([s["arm_qpos"] - t["arm_qpos"] for t, s in zip(true, shown, strict=True)])  # [T, E, 7]
    per_episode = error.mean(0)  # the bias: constant through the episode
    assert 0.01 < per_episode.std().item() < 0.03
    assert 0.003 < (error - per_episode).std().item() < 0.007
    offset = torch.stack([s["puck_pos"] - t["puck_pos"] for t, s in zip(true, shown, strict=True)])
    assert 0.007 < offset.std().item() < 0.013
    for t, s in zip(true, shown, strict=True):
        moved = s["puck_pos"] - t["puck_pos"]
        torch.testing.assert_close(s["to_puck"] - t["to_puck"], moved)  # the tool to the puck: the same offset
        torch.testing.assert_close(s["puck_to_goal"] - t["puck_to_goal"], -moved[:, :2])
        torch.testing.assert_close(s["ee_pos"], t["ee_pos"])  # forward kinematics: passed through


def test_nothing_set_leaves_the_env_unwrapped():
    env = _env()
    assert add_sensing(env, SensingConfig(), seed=0) is env
    env.close()


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (SensingConfig(delay_min=3, delay_max=1), r"sensing.delay_min and delay_max must satisfy"),
        (SensingConfig(delay_max=50), r"sensing.delay_max=50 steps is not shorter than an episode \(50\)"),
        (SensingConfig(delay_per="often"), r"sensing.delay_per must be one of episode, step"),
        (SensingConfig(drop_prob=1.0), r"sensing.drop_prob must be in \[0, 1\)"),
        (SensingConfig(joint_pos_noise=-0.1), r"sensing.joint_pos_noise must be a finite standard deviation"),
        (SensingConfig(object_rot_noise=float("nan")), r"sensing.object_rot_noise must be a finite standard"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(cfg, message):
    env = _env(num_envs=1)
    with pytest.raises(ValueError, match=message):
        add_sensing(env, cfg, seed=0)
    env.close()


def test_camera_frames_take_a_per_episode_exposure_and_pixel_noise():
    cfg = SensingConfig(image_brightness=0.1, image_contrast=0.1, image_noise=0.02)
    task = TASK_CONFIGS["panda_reach"](name="panda_reach", obs="pixels", image_size=64)
    plain = TaskVecEnv(make_task(task, 4))
    sensed = add_sensing(TaskVecEnv(make_task(task, 4)), cfg, seed=0)
    true, shown = plain.reset(seed=1)["pixels_front"].float(), sensed.reset(seed=1)["pixels_front"].float()
    residual = shown - true
    offsets = residual.mean((1, 2, 3))  # the brightness of each env's episode (and a little of its contrast)
    assert offsets.std() > 5.0  # about 0.1 of 255 between envs
    assert 2.0 < (residual - residual.mean((2, 3), keepdim=True)).std() < 12.0  # noise of 0.02 * 255, plus contrast
    plain.close()
    sensed.close()
