"""Learners, one per file, behind the small contract in base.py."""

from __future__ import annotations

from typing import Any

import torch

from robotrl.agents.base import Agent
from robotrl.agents.bc import BC, BCConfig
from robotrl.agents.chunk import ChunkConfig, ChunkCritic
from robotrl.agents.drqv2 import DrQv2, DrQv2Config
from robotrl.agents.sac import SAC, SACConfig
from robotrl.core.spec import ObsSpec

AGENTS: dict[str, tuple[type, type[Agent]]] = {
    "sac": (SACConfig, SAC),
    "drqv2": (DrQv2Config, DrQv2),
    "chunk": (ChunkConfig, ChunkCritic),
    "bc": (BCConfig, BC),
}
AGENT_CONFIGS = {name: cfg for name, (cfg, _) in AGENTS.items()}


def make_agent(cfg: Any, obs_spec: ObsSpec, action_dim: int, device: str | torch.device = "cpu") -> Agent:
    """Instantiate the agent a config names; unknown names list the available agents."""
    name = getattr(cfg, "name", None)
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; available agents: {', '.join(sorted(AGENTS))}")
    _, agent_cls = AGENTS[name]
    return agent_cls(cfg, obs_spec, action_dim, device)


__all__ = [
    "AGENTS",
    "AGENT_CONFIGS",
    "BC",
    "SAC",
    "Agent",
    "BCConfig",
    "ChunkConfig",
    "ChunkCritic",
    "DrQv2",
    "DrQv2Config",
    "SACConfig",
    "make_agent",
]
