"""Structured configs of the task group (no simulator imports: the config layer reads these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GymTaskConfig:
    """Any gymnasium env with a Box action space, e.g. `task=gym task.env_id=HalfCheetah-v5`."""

    name: str = "gym"
    env_id: str = "Pendulum-v1"
    max_episode_steps: int | None = None  # None: the env's registered limit
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gymnasium.make
    render_width: int = 256
    render_height: int = 256
