"""The reference for bench/drqv2_speed.py: DrQ-v2's update as the original implementation
(facebookresearch/drqv2, drqv2.py) performs it, rewritten here from its published structure because the
original is not a package: float conversion of the uint8 batch, replicate pad + grid_sample random shift,
separate encoder/critic/actor Adam optimizers, two Q MLPs, a truncated-normal policy sample, and a
parameter-by-parameter soft update. Run by drqv2_speed.py in its own process, with the default allocator,
and again with robotrl's (`retain_alloc`: freed memory kept in the process;
`reference_updates_per_s_retained_alloc`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RandomShiftsAug(nn.Module):
    def __init__(self, pad: int):
        super().__init__()
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, _ = x.size()
        x = F.pad(x, (self.pad,) * 4, "replicate")
        eps = 1.0 / (h + 2 * self.pad)
        arange = torch.linspace(-1.0 + eps, 1.0 - eps, h + 2 * self.pad, device=x.device, dtype=x.dtype)[:h]
        arange = arange.unsqueeze(0).repeat(h, 1).unsqueeze(2)
        base_grid = torch.cat([arange, arange.transpose(1, 0)], dim=2).unsqueeze(0).repeat(n, 1, 1, 1)
        shift = torch.randint(0, 2 * self.pad + 1, size=(n, 1, 1, 2), device=x.device, dtype=x.dtype)
        shift *= 2.0 / (h + 2 * self.pad)
        return F.grid_sample(x, base_grid + shift, padding_mode="zeros", align_corners=False)


class Encoder(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.convnet = nn.Sequential(
            nn.Conv2d(channels, 32, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=1),
            nn.ReLU(),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.convnet(obs / 255.0 - 0.5).flatten(1)


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out_dim)
    )


class Actor(nn.Module):
    def __init__(self, repr_dim: int, action_dim: int, feature_dim: int, hidden: int):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(repr_dim, feature_dim), nn.LayerNorm(feature_dim), nn.Tanh())
        self.policy = _mlp(feature_dim, hidden, action_dim)

    def forward(self, obs: torch.Tensor, std: float, clip: float) -> torch.Tensor:
        mu = torch.tanh(self.policy(self.trunk(obs)))
        eps = (torch.randn_like(mu) * std).clamp(-clip, clip)
        return (mu + eps).clamp(-1.0 + 1e-6, 1.0 - 1e-6)


class Critic(nn.Module):
    def __init__(self, repr_dim: int, action_dim: int, feature_dim: int, hidden: int):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(repr_dim, feature_dim), nn.LayerNorm(feature_dim), nn.Tanh())
        self.q1 = _mlp(feature_dim + action_dim, hidden, 1)
        self.q2 = _mlp(feature_dim + action_dim, hidden, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.cat([self.trunk(obs), action], dim=-1)
        return self.q1(h), self.q2(h)


class ReferenceDrQv2:
    def __init__(self, channels: int, image_size: int, action_dim: int, feature_dim=50, hidden=1024, lr=1e-4):
        self.encoder = Encoder(channels)
        repr_dim = (
            32 * 35 * 35
            if image_size == 84
            else self.encoder(torch.zeros(1, channels, image_size, image_size)).shape[1]
        )
        self.actor = Actor(repr_dim, action_dim, feature_dim, hidden)
        self.critic = Critic(repr_dim, action_dim, feature_dim, hidden)
        self.critic_target = Critic(repr_dim, action_dim, feature_dim, hidden)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.encoder_opt = torch.optim.Adam(self.encoder.parameters(), lr=lr)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)
        self.aug = RandomShiftsAug(pad=4)
        self.std, self.clip, self.tau, self.discount = 0.2, 0.3, 0.01, 0.99**3

    def update(self, obs, action, reward, next_obs) -> None:
        obs = self.aug(obs.float())
        next_obs = self.aug(next_obs.float())
        obs = self.encoder(obs)
        with torch.no_grad():
            next_obs = self.encoder(next_obs)
        with torch.no_grad():
            next_action = self.actor(next_obs, self.std, self.clip)
            target_q1, target_q2 = self.critic_target(next_obs, next_action)
            target_q = reward + self.discount * torch.min(target_q1, target_q2)
        q1, q2 = self.critic(obs, action)
        critic_loss = F.mse_loss(q1, target_q) + F.mse_loss(q2, target_q)
        self.encoder_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        self.encoder_opt.step()
        obs = obs.detach()
        action = self.actor(obs, self.std, self.clip)
        q1, q2 = self.critic(obs, action)
        actor_loss = -torch.min(q1, q2).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        for param, target in zip(self.critic.parameters(), self.critic_target.parameters(), strict=True):
            target.data.copy_(self.tau * param.data + (1 - self.tau) * target.data)
