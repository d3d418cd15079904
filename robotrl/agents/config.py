"""What every agent's config declares: the settings the training loop and the learner read (batch size, update
schedule, the replay's n-step discounting, frame stack) and the pixel encoder's, nested once for every agent
that sees images. An agent's own settings extend these; nothing here is read by getattr with a default."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any

from robotrl.core.spec import ObsSpec
from robotrl.nn.encoders import ImageStateEncoder

log = logging.getLogger(__name__)


@dataclass
class EncoderConfig:
    """Pixel observations (uint8 image entries): DrQ-v2's conv encoder and trunk, random shifts of `shift_pad`
    pixels on both observations of every update; the state entries are appended to its features."""

    frame_stack: int = 3  # frames stacked per camera (the env is wrapped; the replay stores each frame once)
    conv_channels: int = 32
    conv_layers: int = 4
    conv_stride: int = 1  # stride of the convolutions after the first (stride 2); 2 for a cheap encoder
    feature_dim: int = 50  # image trunk: Linear -> LayerNorm -> tanh
    shift_pad: int = 4  # random-shift augmentation, pixels

    def image_state_encoder(self, obs_spec: ObsSpec, obs_norm: bool) -> ImageStateEncoder:
        """The encoder these settings describe, for `obs_spec`'s image and state entries."""
        return ImageStateEncoder(
            obs_spec, self.feature_dim, self.conv_channels, self.conv_layers, self.conv_stride, obs_norm
        )

    def validate(self) -> None:
        for name in ("frame_stack", "conv_channels", "conv_layers", "conv_stride", "feature_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.encoder.{name} must be >= 1, got {getattr(self, name)}")
        if self.shift_pad < 0:
            raise ValueError(f"agent.encoder.shift_pad must be >= 0, got {self.shift_pad}")


@dataclass
class AgentConfig:
    """The part of `agent.*` that the loop and the learner read, whatever the agent."""

    name: str = ""
    batch_size: int = 256
    utd_ratio: int = 1  # gradient updates per update round
    update_every: int = 1  # env steps per update round (every env's step counts)
    # Updates per vectorized step (all num_envs envs stepping once) instead of utd_ratio per update_every env
    # steps; fractional allowed (0.25: one update every 4 vectorized steps). With thousands of GPU envs the
    # per-transition default would make thousands of updates per vectorized step (agents/schedule.py).
    updates_per_step: float | None = None
    # The update as one compiled program (agents/compiled.py): its losses under torch.compile and, on CUDA,
    # the whole update (backward pass and optimizer steps too) replayed as a CUDA graph. A small update is
    # bound by kernel launches on a GPU (SAC at batch 256: 166 eager updates/s on an H100). Off: the eager
    # update, the reference the compiled one is tested against.
    compile: bool = False
    encoder: EncoderConfig = field(default_factory=EncoderConfig)

    @property
    def frame_stack(self) -> int:
        """Frames per stacked pixel observation (the env wrapper and the replay read it)."""
        return self.encoder.frame_stack

    @property
    def replay_n_step(self) -> int:
        """Steps the replay sums per sampled transition (n-step returns; an action chunk's length)."""
        return 1

    @property
    def replay_gamma(self) -> float:
        """The discount the replay's n-step sums apply (unused at one step)."""
        return 1.0

    def validate(self) -> None:
        for name in ("batch_size", "utd_ratio", "update_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        if self.updates_per_step is not None:
            if not (math.isfinite(self.updates_per_step) and self.updates_per_step > 0):
                raise ValueError(
                    f"agent.updates_per_step must be a finite number > 0 or null, got {self.updates_per_step}"
                )
            if (self.utd_ratio, self.update_every) != (1, 1):
                raise ValueError(
                    f"agent.updates_per_step={self.updates_per_step} replaces agent.utd_ratio and agent.update_every "
                    f"(got {self.utd_ratio} and {self.update_every}): set one schedule"
                )
        self.encoder.validate()


ENCODER_KEYS = frozenset(f.name for f in fields(EncoderConfig))


def nest_encoder_keys(agent: dict[str, Any], source: str) -> dict[str, Any]:
    """`agent` (a run's saved `agent` settings) with the pixel encoder's keys that runs saved before they were
    nested (agent.frame_stack, agent.conv_layers, ...) moved under `encoder`; logs once per file it moves."""
    flat = sorted(ENCODER_KEYS & set(agent))
    if not flat:
        return agent
    moved = {k: v for k, v in agent.items() if k not in ENCODER_KEYS}
    moved["encoder"] = {**{k: agent[k] for k in flat}, **dict(agent.get("encoder") or {})}
    log.info("%s: agent.%s read as agent.encoder.* (saved before the encoder settings were nested)", source, flat)
    return moved
