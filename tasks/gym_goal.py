"""Hindsight relabelling for gymnasium goal envs (gymnasium-robotics' Fetch, Shadow hand, mazes), as SB3's HER.

A goal env observes a dict with `observation`, `achieved_goal` and `desired_goal` and computes its reward
for any goal with `compute_reward(achieved_goal, desired_goal, info)`, vectorised over leading dimensions.
`GymGoalTask` turns that into the GoalSpec the replay relabels with (robotrl/data/hindsight.py): the goal
a state reached is its `achieved_goal`, asking for another goal replaces `desired_goal`, and rewards come
from the env's own `compute_reward`, so a relabelled reward is exactly the one the env would have given.
Success comes from `_is_success(achieved_goal, desired_goal)`, which gymnasium-robotics' robot envs define.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from robotrl.data.hindsight import GoalSpec

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


def is_goal_env(env: gym.Env) -> bool:
    """Whether `env` follows gymnasium-robotics' GoalEnv contract: the three dict keys and compute_reward."""
    space = env.observation_space
    return (
        isinstance(space, gym.spaces.Dict)
        and all(key in space.spaces for key in GOAL_KEYS)
        and callable(getattr(env.unwrapped, "compute_reward", None))
    )


class GymGoalTask:
    """The goal side of one gymnasium goal env (the first of a GymVecEnv: all are made from one id)."""

    expert = None  # gymnasium envs bring no scripted expert (the scripted operator refuses them by name)

    def __init__(self, env: gym.Env, env_id: str, episode_steps: int):
        if not is_goal_env(env):
            raise ValueError(
                f"{env_id} is not a gymnasium goal env (a dict observation with {', '.join(GOAL_KEYS)} and "
                "compute_reward); hindsight relabelling needs one"
            )
        self.env_id = env_id
        self.episode_steps = episode_steps
        self._env = env.unwrapped

    def goal_spec(self) -> GoalSpec:
        return GoalSpec(
            achieved=lambda obs: obs["achieved_goal"],
            with_goal=lambda obs, goal: {**obs, "desired_goal": goal},
            success=self._success,
            reward=self._reward,
        )

    def _reward(self, obs: dict[str, torch.Tensor], goal: torch.Tensor) -> torch.Tensor:
        achieved = obs["achieved_goal"]
        # One call per sampled batch, vectorised as the GoalEnv contract requires (info is unused by every
        # gymnasium-robotics env; one empty dict per row keeps it indexable for envs that read it)
        rows = achieved.reshape(-1, achieved.shape[-1])
        info = np.array([{} for _ in range(len(rows))])
        reward = self._env.compute_reward(_numpy(rows), _numpy(goal.reshape(rows.shape)), info)
        reward = np.asarray(reward, dtype=np.float32).reshape(achieved.shape[:-1])
        return torch.from_numpy(reward).to(achieved.device)

    def _success(self, obs: dict[str, torch.Tensor], goal: torch.Tensor) -> torch.Tensor:
        check = getattr(self._env, "_is_success", None)
        if check is None:
            raise ValueError(
                f"{self.env_id} defines no _is_success, so a relabelled goal's success is unknown; relabelling "
                "still works where success does not end episodes (gym tasks never end them early)"
            )
        achieved = obs["achieved_goal"]
        rows = achieved.reshape(-1, achieved.shape[-1])
        success = np.asarray(check(_numpy(rows), _numpy(goal.reshape(rows.shape))), dtype=bool)
        return torch.from_numpy(success.reshape(achieved.shape[:-1])).to(achieved.device)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float64).numpy()
