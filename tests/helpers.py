"""Shared helpers for tests that run the real entry points."""

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A training run small enough for the test suite: seconds, not minutes.
TINY = [
    "task=gym",
    "total_steps=600",
    "learning_starts=200",
    "log_interval=100",
    "eval_interval=300",
    "eval_episodes=1",
    "checkpoint_interval=300",
    "replay_capacity=5000",
    "agent.batch_size=32",
    "agent.actor_hidden=[32,32]",
    "agent.critic_hidden=[32,32]",
    "progress=false",
    "task.max_episode_steps=50",
]


def run_module(module: str, *args: str, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, MUJOCO_GL="egl", HYDRA_FULL_ERROR="0")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


DEADLINE = 10.0  # seconds; every wait polls and returns as soon as its condition holds


def wait_until(condition, timeout: float = DEADLINE, interval: float = 0.005) -> bool:
    """Polls `condition` until it holds or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()
