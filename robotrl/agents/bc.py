"""Behaviour cloning: a deterministic policy regressed onto recorded actions (the baseline HIL-SERL and
LeRobot compare against, and a warm start for the RL learners).

It learns from the offline rows of a batch (`Batch.demo`; every row when the batch has no mask), so
`robotrl-train agent=bc hil.demos=[...] hil.offline_ratio=1.0` trains it on demonstrations alone, while
the env steps only serve its evaluations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from robotrl.agents.base import Agent, behaviour_cloning_loss, check_finite, check_layer_widths, make_adam
from robotrl.agents.config import AgentConfig
from robotrl.core.spec import PRIVILEGED, ObsSpec, check_obs, pixel_keys
from robotrl.data.replay import Batch
from robotrl.nn import StateEncoder, mlp
from robotrl.nn.augment import shift_images


@dataclass
class BCConfig(AgentConfig):
    name: str = "bc"
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    lr: float = 1e-3
    exploration_std: float = 0.0  # Gaussian noise on acting (non-deterministic) actions
    obs_norm: bool = False  # standardise state features with the training batches' running statistics (as SAC's)

    def validate(self) -> None:
        super().validate()
        check_finite(self, ("lr",), 0.0)
        check_finite(self, ("exploration_std",), 0.0, inclusive=True)
        check_layer_widths(self, ("hidden",))


class BC(Agent):
    def __init__(self, cfg: BCConfig, obs_spec: ObsSpec, action_dim: int, device: str | torch.device = "cpu"):
        if PRIVILEGED in obs_spec:
            raise ValueError(
                "agent=bc has no privileged critic input (randomization.privileged=true): use agent=sac, or "
                "set randomization.privileged=false"
            )
        super().__init__()
        cfg.validate()
        self.cfg, self.obs_spec, self.action_dim = cfg, dict(obs_spec), action_dim
        self.pixel_keys = pixel_keys(obs_spec)
        if self.pixel_keys:
            self.encoder = cfg.encoder.image_state_encoder(obs_spec, cfg.obs_norm)
        else:
            self.encoder = StateEncoder(obs_spec, cfg.obs_norm)
        self.policy = mlp(self.encoder.out_dim, cfg.hidden, action_dim)
        self.to(device)
        self.optimizer = make_adam(self.parameters(), cfg.lr)
        self.num_updates = 0

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"bc": self.optimizer}

    def _action(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.tanh(self.policy(self.encoder(obs)))

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        check_obs(self.obs_spec, obs)
        action = self._action(obs)
        if deterministic or self.cfg.exploration_std == 0:
            return action
        return (action + self.cfg.exploration_std * torch.randn_like(action)).clamp_(-1.0, 1.0)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.pixel_keys:
            batch = dataclasses.replace(batch, obs=shift_images(batch.obs, self.pixel_keys, self.cfg.encoder.shift_pad))
        self.encoder.observe(batch.obs)
        demo = batch.demo
        if demo is None:
            demo = torch.ones(batch.action.shape[0], dtype=torch.bool, device=batch.action.device)
        loss = behaviour_cloning_loss(self._action(batch.obs), batch.action, demo)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.num_updates += 1
        return {"bc_loss": loss.detach()}
