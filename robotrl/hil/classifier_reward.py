"""A VecEnv wrapper whose reward and success come from a learned reward classifier.

`ClassifierReward(env, classifier)` steps `env`, runs the classifier once on the step's `next_obs` camera
frames (all envs in one batch, under torch.inference_mode) and reports `success_reward` (default 1) where
it says success and `failure_reward` (default 0) elsewhere, in place of the env's own reward; the
classifier's verdict is also `StepResult.success`. The env's own success of the last step stays readable as
`env_success` (a simulator's check, or nothing on hardware), for measuring the classifier online.

Frame stacks: the classifier reads `3 * frame_stack` channels per camera; an env whose images carry more
(a FrameStack wrapper stacking more frames) gives it the newest ones. Image size must match exactly.

Ending episodes on success (`terminate_on_success`, as HIL-SERL does on a real robot): the VecEnv contract
resets every env at once (`reset()` has no env ids), so this is offered for `num_envs == 1` only. There the
step is reported `terminated` (unless the env itself ended the episode at that step), and `obs` is a fresh
`env.reset()`'s observation, exactly what an env that terminated by itself would have returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from robotrl.core.env import EnvCancelled, Obs, StepResult, VecEnv
from robotrl.hil.reward_classifier import RewardClassifier


class ClassifierReward:
    def __init__(
        self,
        env: VecEnv,
        classifier: RewardClassifier,
        success_reward: float = 1.0,
        failure_reward: float = 0.0,
        terminate_on_success: bool = False,
    ):
        if not isinstance(classifier, RewardClassifier):
            raise TypeError(f"classifier must be a RewardClassifier, got {type(classifier).__name__}")
        for name, value in (("success_reward", success_reward), ("failure_reward", failure_reward)):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if terminate_on_success and env.num_envs != 1:
            raise ValueError(
                f"terminate_on_success needs num_envs == 1, got {env.num_envs}: the VecEnv contract resets all "
                "envs at once, so one env's success cannot end only its own episode"
            )
        self.env, self.classifier = env, classifier.eval()
        self.name, self.num_envs, self.action_dim = env.name, env.num_envs, env.action_dim
        self.obs_spec = env.obs_spec
        self.control = getattr(env, "control", None)
        self.has_success = True
        self.success_reward, self.failure_reward = float(success_reward), float(failure_reward)
        self.terminate_on_success = terminate_on_success
        self._check_env_images()
        self.env_success: torch.Tensor | None = None  # the wrapped env's own success at the last step

    def _check_env_images(self) -> None:
        wanted = self.classifier.architecture.input_shape
        for key in self.classifier.keys:
            if key not in self.obs_spec:
                raise ValueError(
                    f"{self.name}: the reward classifier reads {key!r}, the env observes {sorted(self.obs_spec)} "
                    "(set task.obs=pixels or state+pixels and the classifier's cameras in task.cameras)"
                )
            spec = self.obs_spec[key]
            channels, height, width = spec.shape if len(spec.shape) == 3 else (0, 0, 0)
            if spec.dtype != torch.uint8 or (height, width) != wanted[1:] or channels < wanted[0] or channels % 3:
                raise ValueError(
                    f"{self.name}: observation {key!r} is {list(spec.shape)} {spec.dtype}; the reward classifier "
                    f"needs uint8 [{wanted[0]} (or a larger stack), {wanted[1]}, {wanted[2]}]"
                )

    def classify(self, obs: Obs) -> torch.Tensor:
        """The classifier's success [E] bool (CPU) for a batch of observations: one forward pass."""
        return classify(self.classifier, obs, f"{self.name} observation")

    def reset(self, seed: int | None = None) -> Obs:
        self.env_success = None
        return self.env.reset(seed=seed)

    def step(self, action: torch.Tensor) -> StepResult:
        result = self.env.step(action)
        self.env_success = result.success
        success = self.classify(result.next_obs)
        reward = torch.where(success, self.success_reward, self.failure_reward).to(torch.float32)
        terminated, truncated, obs = result.terminated, result.truncated, result.obs
        if self.terminate_on_success and bool(success.any()):
            if not bool((terminated | truncated).any()):  # the env ended nothing: start its next episode here
                try:
                    obs = self.env.reset()
                except EnvCancelled:  # stopped while a robot's scene was awaited: this step still counts
                    obs = result.next_obs
            terminated, truncated = success.clone(), torch.zeros_like(success)
        return StepResult(
            obs=obs,
            next_obs=result.next_obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            intervened=result.intervened,
            action=result.action,
        )

    def render(self) -> np.ndarray:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def classify(classifier: RewardClassifier, obs: Obs, what: str = "observation") -> torch.Tensor:
    """`classifier`'s success [N] bool (CPU) for a batch of observations whose camera entries hold at least
    the classifier's frame stack (the newest frames are read): one forward pass."""
    channels = classifier.architecture.input_shape[0]
    frames = {key: obs[key][:, -channels:].to(classifier.device, non_blocking=True) for key in classifier.keys}
    classifier.check_frames(frames, what)
    with torch.inference_mode():
        probs = torch.sigmoid(classifier(frames))
    return (probs >= classifier.threshold).cpu()


def demo_relabeller(
    classifier: RewardClassifier, success_reward: float = 1.0, failure_reward: float = 0.0, batch: int = 256
) -> Callable[[Obs], tuple[torch.Tensor, torch.Tensor]]:
    """Rewards [T] and success verdicts [T] for a recorded episode's next observations [T, ...], as
    ClassifierReward (with the same rewards) scores online steps: demonstrations and online data must share
    one reward function, or half of each batch teaches that success is worth what failure is worth online;
    and with `task.terminate_on_success` a demonstration ends where the classifier, not the recording, saw
    success first."""
    classifier = classifier.eval()

    def relabel(next_obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        steps = next(iter(next_obs.values())).shape[0]
        success = torch.cat(
            [
                classify(classifier, {k: v[i : i + batch] for k, v in next_obs.items()}, "demonstration frame")
                for i in range(0, steps, batch)
            ]
        )
        return torch.where(success, success_reward, failure_reward).to(torch.float32), success

    return relabel
