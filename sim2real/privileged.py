"""An asymmetric critic's privileged input: the physics each env runs with, as an observation entry (`PRIVILEGED`)
that SAC's critic reads and its actor never does (agents/sac.py). A robot has no such entry, and a deployed policy
needs none. Knowing the mass, friction and gains it is judging, the critic fits values that differ from episode to
episode instead of averaging them, while the actor still has to act from what a robot observes."""

from __future__ import annotations

import dataclasses

import torch
from robotrl.sim2real.randomization import PhysicsRandomizer

from robotrl.core.env import Obs, StepResult
from robotrl.core.spec import PRIVILEGED, TensorSpec


class PrivilegedObs:
    """A VecEnv wrapper that adds `PRIVILEGED` [E, P] float32 to `env`'s observations: every randomization term's
    values in force (`PhysicsRandomizer.relative_values`). A step's `next_obs` carries the values the step ran
    under, its `obs` those in force after it (an env that reset within the step has drawn its next episode's)."""

    def __init__(self, env, randomizer: PhysicsRandomizer):
        if PRIVILEGED in env.obs_spec:
            raise ValueError(f"{env.name}: the observation already has a {PRIVILEGED!r} entry")
        self.env, self.randomizer = env, randomizer
        self.name, self.num_envs, self.action_dim = env.name, env.num_envs, env.action_dim
        self.has_success, self.control = env.has_success, env.control
        self.names = randomizer.value_names()
        self.obs_spec = {**env.obs_spec, PRIVILEGED: TensorSpec((len(self.names),))}

    def reset(self, seed: int | None = None) -> Obs:
        obs = self.env.reset(seed=seed)
        return {**obs, PRIVILEGED: self.randomizer.relative_values()}

    def step(self, action: torch.Tensor) -> StepResult:
        before = self.randomizer.relative_values()  # the physics this step runs under
        result = self.env.step(action)
        after = self.randomizer.relative_values()  # redrawn where an env reset or an interval term was due
        return dataclasses.replace(
            result, obs={**result.obs, PRIVILEGED: after}, next_obs={**result.next_obs, PRIVILEGED: before}
        )

    def render(self):
        return self.env.render()

    def close(self) -> None:
        self.env.close()
