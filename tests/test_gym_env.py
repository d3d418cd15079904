import gymnasium as gym
import numpy as np
import pytest
import torch
from robotrl.tasks import make_env
from robotrl.tasks.configs import GymTaskConfig


class ShapeShiftingEnv(gym.Env):
    """A buggy env: its observation loses a value on the third step."""

    observation_space = gym.spaces.Box(-1, 1, (3,))
    action_space = gym.spaces.Box(-2, 2, (1,))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.zeros(2 if self.t == 3 else 3, dtype=np.float32)
        return obs, float(action[0]), False, self.t >= 5, {"success": self.t == 4}


gym.register("robotrl_test/ShapeShifting-v0", ShapeShiftingEnv)


def test_actions_map_onto_the_env_bounds_and_episodes_autoreset():
    env = make_env(GymTaskConfig(env_id="robotrl_test/ShapeShifting-v0"))
    env.reset(seed=0)
    r = env.step(torch.tensor([[1.0]]))
    assert r.reward.item() == pytest.approx(2.0)  # +1 maps to the upper bound 2
    r = env.step(torch.tensor([[-0.5]]))
    assert r.reward.item() == pytest.approx(-1.0)


def test_observation_of_the_wrong_shape_is_named():
    env = make_env(GymTaskConfig(env_id="robotrl_test/ShapeShifting-v0"))
    env.reset(seed=0)
    env.step(torch.zeros(1, 1))
    env.step(torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"observation\['state'\] has 2 values, expected 3"):
        env.step(torch.zeros(1, 1))


def test_bad_actions_are_rejected_with_the_task_and_value():
    env = make_env(GymTaskConfig(env_id="Pendulum-v1"), num_envs=2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"Pendulum-v1.*shape \[2, 1\]"):
        env.step(torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"Pendulum-v1: non-finite action"):
        env.step(torch.tensor([[0.0], [float("nan")]]))
    with pytest.raises(ValueError, match=r"outside \[-1, 1\].*1.5"):
        env.step(torch.tensor([[0.0], [1.5]]))


class WideBoundsEnv(ShapeShiftingEnv):
    """Finite bounds whose float32 width (2 * 3.4e38) overflows."""

    action_space = gym.spaces.Box(-np.finfo(np.float32).max, np.finfo(np.float32).max, (1,))

    def step(self, action):
        return np.zeros(3, dtype=np.float32), float(action[0]), False, False, {}


gym.register("robotrl_test/WideBounds-v0", WideBoundsEnv)


def test_actions_stay_finite_for_bounds_at_the_float32_limit():
    env = make_env(GymTaskConfig(env_id="robotrl_test/WideBounds-v0"))
    env.reset(seed=0)
    assert env.step(torch.zeros(1, 1)).reward.item() == 0.0  # the middle of the range, not inf
    assert env.step(torch.ones(1, 1)).reward.item() == pytest.approx(float(np.finfo(np.float32).max), rel=1e-6)


def test_discrete_action_space_is_refused():
    with pytest.raises(ValueError, match=r"CartPole-v1.*Discrete\(2\).*continuous"):
        make_env(GymTaskConfig(env_id="CartPole-v1"))


def test_unknown_env_id_and_task_name_are_reported():
    with pytest.raises(ValueError, match=r"task\.env_id=.NoSuchEnv-v0."):
        make_env(GymTaskConfig(env_id="NoSuchEnv-v0"))
    with pytest.raises(ValueError, match="available tasks: gym"):
        make_env(type("Cfg", (), {"name": "nope"})())


def test_final_observation_goes_to_next_obs_and_reset_observation_to_obs():
    env = make_env(GymTaskConfig(env_id="Pendulum-v1", max_episode_steps=3))
    env.reset(seed=1)
    for _ in range(2):
        r = env.step(torch.zeros(1, 1))
        assert torch.equal(r.obs["state"], r.next_obs["state"])
    r = env.step(torch.zeros(1, 1))
    assert r.truncated.item() and not r.terminated.item()
    assert not torch.equal(r.obs["state"], r.next_obs["state"])


def test_goal_dict_observations_keep_one_entry_per_key():
    pytest.importorskip("gymnasium_robotics")
    env = make_env(GymTaskConfig(env_id="FetchReach-v4"))
    obs = env.reset(seed=0)
    assert set(obs) == {"observation", "achieved_goal", "desired_goal"}
    assert obs["desired_goal"].shape == (1, 3) and obs["desired_goal"].dtype == torch.float32
    r = env.step(torch.zeros(1, env.action_dim))
    assert env.has_success and r.success.dtype == torch.bool


def test_mujoco_env_renders_headless():
    env = make_env(GymTaskConfig(env_id="HalfCheetah-v5", render_width=64, render_height=48), render=True)
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (48, 64, 3) and frame.dtype == np.uint8 and frame.std() > 0
    env.close()


@pytest.mark.parametrize(
    ("env_id", "keys"),
    [
        ("FetchPickAndPlace-v4", {"observation", "achieved_goal", "desired_goal"}),
        ("AdroitHandDoor-v1", {"state"}),
        ("HandManipulateBlock-v1", {"observation", "achieved_goal", "desired_goal"}),
    ],
)
def test_gymnasium_robotics_fetch_adroit_and_shadow_hand(env_id, keys):
    pytest.importorskip("gymnasium_robotics")
    env = make_env(GymTaskConfig(env_id=env_id))
    obs = env.reset(seed=0)
    assert set(obs) == keys and all(v.dtype == torch.float32 for v in obs.values())
    result = env.step(torch.zeros(1, env.action_dim))
    assert env.has_success and result.success.shape == (1,)
    env.close()


def test_a_num_envs_the_ram_cannot_hold_fails_after_the_probe_naming_it():
    """The first 8 envs are built and measured (Pendulum: a few KB each, Python objects only); a billion would not
    fit, and fail before the rest are built, instead of building envs until the OOM killer ends the run."""
    from robotrl.tasks.gym_env import PROBE_ENVS, GymVecEnv

    with pytest.raises(MemoryError, match=rf"num_envs=1000000000 of Pendulum-v1 needs .* first {PROBE_ENVS}\)"):
        GymVecEnv(GymTaskConfig(name="gym", env_id="Pendulum-v1"), 10**9)
    assert GymVecEnv(GymTaskConfig(name="gym", env_id="Pendulum-v1"), PROBE_ENVS + 4).num_envs == PROBE_ENVS + 4
