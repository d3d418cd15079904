"""Built-in tasks as plain gymnasium envs: `gymnasium.make("robotrl/PandaReach-v0")`.

Importing robotrl.tasks registers them. Observations are dicts of float32 arrays, actions are in [-1, 1].
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import robotrl.tasks as tasks  # the package imports this module first; its names are read when an env is made
import torch

GYM_IDS = {
    "panda_reach": "robotrl/PandaReach-v0",
    "panda_push": "robotrl/PandaPush-v0",
    "panda_pick_cube": "robotrl/PandaPickCube-v0",
    "panda_peg_insert": "robotrl/PandaPegInsert-v0",
    "hand_reorient": "robotrl/HandReorient-v0",
}


class TaskGymEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 25}

    def __init__(self, task: str, render_mode: str | None = None, **overrides):
        cfg = tasks.TASK_CONFIGS[task](name=task)
        for key, value in overrides.items():
            if not hasattr(cfg, key):
                raise TypeError(f"{task}: unknown option {key!r}")
            setattr(cfg, key, value)
        self._env = tasks.make_env(cfg, num_envs=1)
        self.render_mode = render_mode
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self._env.action_dim,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                k: gym.spaces.Box(0, 255, s.shape, np.uint8)
                if s.dtype == torch.uint8
                else gym.spaces.Box(-np.inf, np.inf, s.shape, np.float32)
                for k, s in self._env.obs_spec.items()
            }
        )
        self._obs = None

    @staticmethod
    def _np(obs) -> dict[str, np.ndarray]:
        return {k: v[0].numpy() for k, v in obs.items()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31))
        return self._np(self._env.reset(seed=seed)), {}

    def step(self, action):
        result = self._env.step(torch.as_tensor(np.asarray(action, dtype=np.float32)).reshape(1, -1))
        # gymnasium's contract: the caller resets; the final observation is the one to return.
        info = {"success": bool(result.success[0])}
        return (
            self._np(result.next_obs),
            float(result.reward[0]),
            bool(result.terminated[0]),
            bool(result.truncated[0]),
            info,
        )

    def render(self):
        return self._env.render()

    def close(self):
        self._env.close()


def register_envs() -> None:
    for task, env_id in GYM_IDS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=TaskGymEnv, kwargs={"task": task}, disable_env_checker=True)
