"""Deterministic evaluation episodes, with an optional video of the first one and the smoothness of the
actions taken (robotrl/runtime/smoothness.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from robotrl.agents.base import Agent
from robotrl.core.env import VecEnv
from robotrl.runtime.smoothness import ActionSmoothness

log = logging.getLogger(__name__)


def evaluate(
    agent: Agent,
    env: VecEnv,
    episodes: int,
    seed: int,
    video_path: Path | None = None,
    deterministic: bool = True,
    fps: int = 30,
) -> dict[str, float]:
    """Run `episodes` full episodes on `env` (one env: episodes run in turn) and average them.

    The agent acts on its actor clock for this env, reset at the start: with `deterministic=False` it
    explores as in training (its exploration state is reset; an in-process training run keeps evaluating
    deterministically), with `deterministic=True` the deterministic actor's own state is used (action
    chunks being executed), which leaves the training envs' exploration state alone.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if env.num_envs != 1:
        raise ValueError(f"evaluation runs on a single env, got num_envs={env.num_envs}")
    returns, lengths, successes, steps_to_success = [], [], [], []
    frames: list[np.ndarray] = []
    recording = video_path is not None
    smoothness = ActionSmoothness()
    obs = env.reset(seed=seed)
    if deterministic:
        agent.reset_evaluation(env.num_envs)
    else:
        agent.reset_exploration(env.num_envs)
    device = agent.device
    while len(returns) < episodes:
        ep_return, ep_len, ep_success = 0.0, 0, False
        while True:
            if recording:
                recording = _grab(env, frames)
            action = agent.act({k: v.to(device) for k, v in obs.items()}, deterministic=deterministic).cpu()
            smoothness.add(action, torch.tensor([ep_len == 0]))
            result = env.step(action)
            episode_start = result.terminated | result.truncated
            if deterministic:
                agent.advance_evaluation(episode_start)
            else:
                agent.advance_exploration(episode_start)
            ep_return += float(result.reward[0])
            ep_len += 1
            if not ep_success and bool(result.success[0]):
                ep_success = True
                steps_to_success.append(ep_len)  # the cycle time: steps until the task first succeeds
            obs = result.obs
            if bool(result.terminated[0] | result.truncated[0]):
                break
        if recording:
            recording = False  # only the first episode is filmed
        returns.append(ep_return)
        lengths.append(ep_len)
        successes.append(ep_success)
    if video_path is not None and frames:
        write_video(video_path, frames, fps)
    out = {"return": float(np.mean(returns)), "return_std": float(np.std(returns)), "length": float(np.mean(lengths))}
    if env.has_success:
        out["success"] = float(np.mean(successes))
        if steps_to_success:
            out["steps_to_success"] = float(np.mean(steps_to_success))
    out.update(smoothness.flush())
    return out


def evaluate_batched(agent: Agent, env: VecEnv, episodes: int, seed: int) -> dict[str, float]:
    """Run `episodes` deterministic episodes on `env`'s envs at once, one per env and round (`episodes` a multiple
    of `env.num_envs`), and average them: the evaluation of runs with thousands of envs (hundreds of episodes in
    an episode's time). Each env's episode after its first end is not counted: the env auto-resets and runs on,
    ignored, until every env of the round has ended. No video: `evaluate` films one env."""
    if episodes < 1 or episodes % env.num_envs:
        raise ValueError(f"episodes ({episodes}) must be a positive multiple of the evaluation's {env.num_envs} envs")
    returns, lengths, successes, steps_to_success = [], [], [], []
    smoothness = ActionSmoothness()
    device = agent.device
    for round_ in range(episodes // env.num_envs):
        obs = env.reset(seed=seed + round_ * env.num_envs)  # gymnasium envs seed env i with seed + i: no overlap
        agent.reset_evaluation(env.num_envs)
        running = torch.ones(env.num_envs, dtype=torch.bool)
        ep_return = torch.zeros(env.num_envs)
        ep_len = torch.zeros(env.num_envs, dtype=torch.long)
        first_success = torch.zeros(env.num_envs, dtype=torch.long)  # the step of the first success; 0: none yet
        starts = torch.ones(env.num_envs, dtype=torch.bool)
        while running.any():
            action = agent.act({k: v.to(device) for k, v in obs.items()}, deterministic=True).cpu()
            smoothness.add(action, starts)  # an auto-reset env's next episode too: real actions, a new segment
            result = env.step(action)
            ended = starts = result.terminated | result.truncated
            agent.advance_evaluation(ended)
            ep_return += torch.where(running, result.reward.float(), 0.0)
            ep_len += running.long()
            if env.has_success:
                first = running & result.success & (first_success == 0)
                first_success[first] = ep_len[first]
            running &= ~ended
            obs = result.obs
        returns.append(ep_return)
        lengths.append(ep_len.float())
        successes.append(first_success > 0)
        steps_to_success.append(first_success[first_success > 0].float())
    all_returns = torch.cat(returns)
    out = {
        "return": float(all_returns.mean()),
        "return_std": float(all_returns.std(correction=0)),
        "length": float(torch.cat(lengths).mean()),
    }
    if env.has_success:
        out["success"] = float(torch.cat(successes).float().mean())
        reached = torch.cat(steps_to_success)
        if len(reached):
            out["steps_to_success"] = float(reached.mean())
    out.update(smoothness.flush())
    return out


def _grab(env: VecEnv, frames: list[np.ndarray]) -> bool:
    try:
        frames.append(env.render())
        return True
    except Exception as err:  # a missing GL backend must not cost the user their evaluation
        log.warning("video skipped: rendering failed (%s)", err)
        frames.clear()
        return False


def write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(str(path), fps=fps, codec="libx264", macro_block_size=1) as writer:
        for frame in frames:
            writer.append_data(frame)
