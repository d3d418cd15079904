"""A sensor model over a simulated task's observations: delay, dropped messages, and per-episode bias plus per-step
noise on joint positions and velocities and on tracked objects' poses, as a robot's joint encoders and its object
tracker deliver them.

Each entry is treated by where a robot gets it (the task's `observation_entries`): joint states get the joint
noise; a tracked object's position noise moves its `pos`, its `from_ee` (the tool to the object) and, with the
opposite sign, its `to_goal`, so the entries of one object stay consistent. Entries a robot computes from the
others (the tool point by forward kinematics, goals) and camera frames are passed through.

Delay is counted in control steps: the policy sees the observation of `d` steps ago, `d` drawn per episode or per
step from `[delay_min, delay_max]`; what it sees never goes back in time (a draw that would show an older state than
the last one shown repeats that one), and a dropped message repeats the last one shown. An episode starts from its
first observation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from robotrl.sim2real.randomization import stream_seed

from robotrl.core.deploy_spec import ObsEntry
from robotrl.core.env import Obs, StepResult
from robotrl.core.rotations import quat_multiply

DELAY_PER = ("episode", "step")


@dataclass
class SensingConfig:
    delay_min: int = 0  # control steps an observation is old when the policy sees it, at least
    delay_max: int = 0  # ... and at most; drawn per env
    delay_per: str = "episode"  # episode | step
    drop_prob: float = 0.0  # chance that a step's message is lost and the last one shown is repeated
    joint_pos_bias: float = 0.0  # rad (m for a slide joint): std of a per-episode offset, per joint
    joint_pos_noise: float = 0.0  # rad: std of per-step noise
    joint_vel_bias: float = 0.0  # rad/s
    joint_vel_noise: float = 0.0  # rad/s
    object_pos_bias: float = 0.0  # m: std of a tracker's per-episode offset, per axis
    object_pos_noise: float = 0.0  # m: per-step
    object_rot_noise: float = 0.0  # rad: std of a per-step rotation of a tracked orientation about a random axis
    # Camera frames (uint8), in units of the full intensity range: a per-episode brightness offset and contrast
    # factor (std around 0 and 1), and per-step pixel noise: a camera's exposure and gain, not the scene
    image_brightness: float = 0.0
    image_contrast: float = 0.0
    image_noise: float = 0.0

    @property
    def enabled(self) -> bool:
        noise = (getattr(self, name) for name in _STDS)
        return self.delay_max > 0 or self.drop_prob > 0 or any(value > 0 for value in noise)

    def validate(self, key: str = "sensing", episode_steps: int | None = None) -> None:
        if self.delay_min < 0 or self.delay_max < self.delay_min:
            raise ValueError(
                f"{key}.delay_min and delay_max must satisfy 0 <= delay_min <= delay_max, got {self.delay_min} and "
                f"{self.delay_max}"
            )
        if episode_steps is not None and self.delay_max >= episode_steps:
            raise ValueError(f"{key}.delay_max={self.delay_max} steps is not shorter than an episode ({episode_steps})")
        if self.delay_per not in DELAY_PER:
            raise ValueError(f"{key}.delay_per must be one of {', '.join(DELAY_PER)}, got {self.delay_per!r}")
        if not (math.isfinite(self.drop_prob) and 0.0 <= self.drop_prob < 1.0):
            raise ValueError(f"{key}.drop_prob must be in [0, 1), got {self.drop_prob}")
        for name in _STDS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key}.{name} must be a finite standard deviation >= 0, got {value}")


_STDS = (
    "joint_pos_bias",
    "joint_pos_noise",
    "joint_vel_bias",
    "joint_vel_noise",
    "object_pos_bias",
    "object_pos_noise",
    "object_rot_noise",
    "image_brightness",
    "image_contrast",
    "image_noise",
)


def _joint_kind(entry: ObsEntry) -> str | None:
    if entry.source != "joint_state":
        return None
    return "vel" if entry.of == "velocity" else "pos"


class SensorModel:
    """A VecEnv wrapper that delivers `env`'s state observations as a robot's sensors would (SensingConfig)."""

    def __init__(self, env, entries: dict[str, ObsEntry], cfg: SensingConfig, seed: int, episode_steps: int):
        cfg.validate(episode_steps=episode_steps)
        self.env, self.cfg = env, cfg
        self.name, self.num_envs, self.obs_spec = env.name, env.num_envs, env.obs_spec
        self.action_dim, self.has_success, self.control = env.action_dim, env.has_success, env.control
        self.entries = {key: entry for key, entry in entries.items() if key in env.obs_spec}
        self.objects = sorted({e.of for e in self.entries.values() if e.source == "object"})
        self.generator = torch.Generator().manual_seed(stream_seed(seed, "sensing"))
        size = cfg.delay_max + 1
        self.history: dict[str, torch.Tensor] = {}  # key -> [size, E, ...] ring of true observations
        self.shown = torch.zeros(self.num_envs, dtype=torch.long)  # the step of the observation last shown
        self.t = torch.zeros(self.num_envs, dtype=torch.long)  # each env's step within its episode
        self.delay = torch.zeros(self.num_envs, dtype=torch.long)
        self.size = size
        self.bias: dict[str, torch.Tensor] = {}  # per episode: joint entries by key, objects by name
        self.last: Obs | None = None  # what each env was shown last (a lost message repeats it)

    # -- draws ----------------------------------------------------------------------------------------------
    def _normal(self, shape: tuple[int, ...], std: float) -> torch.Tensor:
        if std == 0:
            return torch.zeros(shape)
        return torch.randn(shape, generator=self.generator) * std

    def _draw_delay(self, count: int) -> torch.Tensor:
        span = self.cfg.delay_max - self.cfg.delay_min + 1
        return self.cfg.delay_min + torch.randint(span, (count,), generator=self.generator)

    def _new_episodes(self, ids: torch.Tensor, obs: Obs) -> None:
        """Fill the history of `ids` with their first observation and draw their episode's bias and delay."""
        for key, value in obs.items():
            if key not in self.history:
                self.history[key] = value.unsqueeze(0).repeat(self.size, *([1] * value.dim())).clone()
            self.history[key][:, ids] = value[ids].unsqueeze(0)
        self.t[ids] = 0
        self.shown[ids] = 0
        self.delay[ids] = self._draw_delay(len(ids))
        for key, entry in self.entries.items():
            kind = _joint_kind(entry)
            if kind is not None:
                std = self.cfg.joint_pos_bias if kind == "pos" else self.cfg.joint_vel_bias
                self._bias(key, (self.num_envs, *entry.shape))[ids] = self._normal((len(ids), *entry.shape), std)
        for name in self.objects:
            self._bias(name, (self.num_envs, 3))[ids] = self._normal((len(ids), 3), self.cfg.object_pos_bias)
        self._bias("image_brightness", (self.num_envs,))[ids] = self._normal((len(ids),), self.cfg.image_brightness)
        self._bias("image_contrast", (self.num_envs,))[ids] = self._normal((len(ids),), self.cfg.image_contrast)

    def _bias(self, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        if key not in self.bias:
            self.bias[key] = torch.zeros(shape)
        return self.bias[key]

    # -- what the policy sees -------------------------------------------------------------------------------
    def _record(self, obs: Obs) -> None:
        slot = self.t % self.size
        rows = torch.arange(self.num_envs)
        for key, value in obs.items():
            self.history[key][slot, rows] = value

    def _shown(self) -> Obs:
        """The observation each env's sensors deliver now (from the history), with bias and noise; an env whose
        message is lost gets the one it was shown last, as it was shown."""
        delay = self._draw_delay(self.num_envs) if self.cfg.delay_per == "step" else self.delay
        target = torch.maximum(self.t - delay, self.shown)  # never older than what was shown
        slot = target % self.size
        rows = torch.arange(self.num_envs)
        out = self._noisy({key: value[slot, rows].clone() for key, value in self.history.items()})
        if self.cfg.drop_prob > 0 and self.last is not None:
            lost = torch.rand(self.num_envs, generator=self.generator) < self.cfg.drop_prob
            target = torch.where(lost, self.shown, target)
            out = {key: torch.where(_rows(lost, value), self.last[key], value) for key, value in out.items()}
        self.shown = target
        self.last = out
        return out

    def _noisy(self, obs: Obs) -> Obs:
        cfg = self.cfg
        if cfg.image_brightness or cfg.image_contrast or cfg.image_noise:
            for key, value in obs.items():
                if value.dtype == torch.uint8:
                    obs[key] = self._jittered(value)
        for key, entry in self.entries.items():
            kind = _joint_kind(entry)
            if kind is not None:
                std = cfg.joint_pos_noise if kind == "pos" else cfg.joint_vel_noise
                obs[key] = obs[key] + self.bias[key] + self._normal(tuple(obs[key].shape), std)
        for name in self.objects:
            offset = self.bias[name] + self._normal((self.num_envs, 3), cfg.object_pos_noise)
            turn = _random_rotation(self.num_envs, cfg.object_rot_noise, self.generator)
            for key, entry in self.entries.items():
                if entry.source != "object" or entry.of != name:
                    continue
                width = entry.shape[0]
                if entry.part in ("pos", "from_ee"):
                    obs[key] = obs[key] + offset[:, :width]
                elif entry.part == "to_goal":
                    obs[key] = obs[key] - offset[:, :width]
                elif entry.part == "quat" and turn is not None:
                    obs[key] = quat_multiply(turn, obs[key])
        return obs

    def _jittered(self, frames: torch.Tensor) -> torch.Tensor:
        """[E, C, H, W] uint8 frames through this episode's exposure and gain, with pixel noise."""
        shape = (-1, *([1] * (frames.dim() - 1)))
        x = frames.float() / 255.0
        contrast = (1.0 + self.bias["image_contrast"]).clamp_min(0.0).view(shape)
        x = (x - 0.5) * contrast + 0.5 + self.bias["image_brightness"].view(shape)
        if self.cfg.image_noise:
            x = x + self._normal(tuple(frames.shape), self.cfg.image_noise)
        return (x.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)

    # -- VecEnv -----------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Obs:
        obs = self.env.reset(seed=seed)
        self._new_episodes(torch.arange(self.num_envs), obs)
        return self._shown()

    def step(self, action: torch.Tensor) -> StepResult:
        result = self.env.step(action)
        self.t += 1
        self._record(result.next_obs)
        next_obs = self._shown()
        obs = next_obs
        done = result.terminated | result.truncated
        if done.any():
            self._new_episodes(done.nonzero().flatten(), result.obs)
            # a new episode shows its first observation, which fills its history
            first = self._noisy({key: value[0].clone() for key, value in self.history.items()})
            obs = {key: torch.where(_rows(done, value), first[key], value) for key, value in next_obs.items()}
            self.last = obs
        result.obs, result.next_obs = obs, next_obs
        return result

    def render(self):
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))


def _random_rotation(count: int, std: float, generator: torch.Generator) -> torch.Tensor | None:
    """[count, 4] quaternions (w, x, y, z) turning by N(0, std) radians about random axes; None for std 0."""
    if std == 0:
        return None
    axis = torch.randn(count, 3, generator=generator)
    axis = axis / axis.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    half = torch.randn(count, 1, generator=generator) * std / 2
    return torch.cat([torch.cos(half), axis * torch.sin(half)], -1)
