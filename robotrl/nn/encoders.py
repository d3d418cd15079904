"""Observation encoders: turn an observation dict into the flat feature vector a head consumes."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from robotrl.core.spec import PRIVILEGED, ObsSpec, pixel_keys
from robotrl.nn.normalizer import RunningNormalizer


class StateEncoder(nn.Module):
    """Flattens and concatenates the state entries of an observation dict, in a fixed key order.

    Nothing is learned here; it exists so that agents see one interface whether the observation is a
    single vector or a dict of proprioception, object state and goals. With `normalize`, the features are
    standardised by a RunningNormalizer that the agent shows its training batches (`observe`): raw state
    mixes metres, radians and velocities whose scales differ by orders of magnitude.
    """

    def __init__(self, obs_spec: ObsSpec, normalize: bool = False):
        super().__init__()
        self.keys = sorted(obs_spec)
        for key in self.keys:
            if obs_spec[key].dtype == torch.uint8:
                raise ValueError(
                    f"StateEncoder cannot take image entry {key!r} (uint8 {obs_spec[key].shape}); "
                    "use a pixel agent such as agent=drqv2"
                )
        self.out_dim = sum(math.prod(obs_spec[k].shape) for k in self.keys)
        self.normalizer = RunningNormalizer(self.out_dim) if normalize else None

    def flat(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The raw features [B, out_dim], before any normalisation."""
        if len(self.keys) == 1:
            x = obs[self.keys[0]]
            return x.reshape(x.shape[0], -1)
        return torch.cat([obs[k].reshape(obs[k].shape[0], -1) for k in self.keys], dim=-1)

    def observe(self, obs: Mapping[str, torch.Tensor]) -> None:
        """Fold a batch of observations into the normalizer's statistics (nothing without `normalize`)."""
        if self.normalizer is not None:
            self.normalizer.observe(self.flat(obs))

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        x = self.flat(obs)
        return x if self.normalizer is None else self.normalizer(x)


def to_unit_range(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float in [-0.5, 0.5], as DrQ-v2 feeds its encoder."""
    return pixels.float().div_(255.0).sub_(0.5)


class ConvEncoder(nn.Module):
    """DrQ-v2's image encoder: `layers` 3x3 convolutions of `channels` filters (the first with stride 2,
    the others with `stride`, 1 in DrQ-v2), ReLU after each, flattened. 84x84 input with the defaults
    gives 32 x 35 x 35 = 39,200 features."""

    def __init__(self, in_channels: int, image_size: int, channels: int = 32, layers: int = 4, stride: int = 1):
        super().__init__()
        if layers < 1 or channels < 1 or stride < 1:
            raise ValueError(
                f"a conv encoder needs layers, channels and stride >= 1, got {layers}, {channels} and {stride}"
            )
        convs: list[nn.Module] = [nn.Conv2d(in_channels, channels, 3, stride=2), nn.ReLU(inplace=True)]
        side = (image_size - 3) // 2 + 1
        for _ in range(layers - 1):
            convs += [nn.Conv2d(channels, channels, 3, stride=stride), nn.ReLU(inplace=True)]
            side = (side - 3) // stride + 1
        self.convs = nn.Sequential(*convs)
        if side < 1:
            raise ValueError(f"{layers} conv layers leave nothing of a {image_size}x{image_size} image")
        self.out_dim = channels * side * side

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 or float [B, C, H, W] -> [B, out_dim]."""
        x = to_unit_range(pixels) if pixels.dtype == torch.uint8 else pixels
        return self.convs(x).flatten(1)


class PixelEncoder(nn.Module):
    """One ConvEncoder per camera entry (uint8 [C, H, W]); their features are concatenated in key order.

    State entries of the same observation are left to `state` (a StateEncoder, None if there are none), so
    an agent can place them after its image trunk instead of drowning them in tens of thousands of conv
    features.
    """

    def __init__(
        self, obs_spec: ObsSpec, channels: int = 32, layers: int = 4, stride: int = 1, normalize_state: bool = False
    ):
        super().__init__()
        self.image_keys = pixel_keys(obs_spec)
        if not self.image_keys:
            raise ValueError(
                f"a pixel encoder needs uint8 [C, H, W] image entries; the observation has {sorted(obs_spec)}"
            )
        for key in self.image_keys:
            _, height, width = obs_spec[key].shape
            if height != width:
                raise ValueError(f"image entry {key!r} is {height}x{width}; pixel encoders take square images")
        self.cameras = nn.ModuleDict(
            {
                key: ConvEncoder(obs_spec[key].shape[0], obs_spec[key].shape[1], channels, layers, stride)
                for key in self.image_keys
            }
        )
        self.out_dim = sum(encoder.out_dim for encoder in self.cameras.values())
        state_spec = {k: s for k, s in obs_spec.items() if k not in self.image_keys}
        self.state = StateEncoder(state_spec, normalize_state) if state_spec else None
        self.state_dim = self.state.out_dim if self.state is not None else 0

    def observe(self, obs: Mapping[str, torch.Tensor]) -> None:
        """Fold a batch into the state entries' normalizer, if they have one (images need none)."""
        if self.state is not None:
            self.state.observe(obs)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        features = [self.cameras[key](obs[key]) for key in self.image_keys]
        return features[0] if len(features) == 1 else torch.cat(features, dim=-1)

    def state_features(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        return None if self.state is None else self.state(obs)


class ImageTrunk(nn.Module):
    """DrQ-v2's trunk: image features -> `feature_dim` (Linear, LayerNorm, tanh), then the state entries
    (if any) appended unchanged."""

    def __init__(self, image_dim: int, feature_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(image_dim, feature_dim), nn.LayerNorm(feature_dim), nn.Tanh())

    def forward(self, image: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        h = self.net(image)
        return h if state is None else torch.cat([h, state.to(h.dtype)], -1)


class ImageStateEncoder(nn.Module):
    """Pixels and state to one feature vector: a PixelEncoder, then an ImageTrunk. For agents that share
    one encoder between actor and critic (the actor reading detached features)."""

    def __init__(
        self,
        obs_spec: ObsSpec,
        feature_dim: int = 50,
        channels: int = 32,
        layers: int = 4,
        stride: int = 1,
        normalize_state: bool = False,
    ):
        super().__init__()
        self.pixels = PixelEncoder(obs_spec, channels, layers, stride, normalize_state)
        self.image_keys = self.pixels.image_keys
        self.trunk = ImageTrunk(self.pixels.out_dim, feature_dim)
        self.out_dim = feature_dim + self.pixels.state_dim

    def observe(self, obs: Mapping[str, torch.Tensor]) -> None:
        self.pixels.observe(obs)

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.trunk(self.pixels(obs), self.pixels.state_features(obs))


class WithPrivileged(nn.Module):
    """`encoder`'s features, followed by the privileged entry (core/spec.py: PRIVILEGED) where an observation has
    one: the critic's input. Acting, the observation has none and the features are the actor's alone."""

    def __init__(self, encoder: nn.Module, privileged_dim: int):
        super().__init__()
        self.base, self.privileged_dim = encoder, privileged_dim
        self.actor_dim = encoder.out_dim
        self.out_dim = encoder.out_dim + privileged_dim

    def forward(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        features = self.base(obs)
        if PRIVILEGED not in obs:
            return features
        return torch.cat([features, obs[PRIVILEGED].to(features.dtype)], dim=-1)

    def observe(self, obs: Mapping[str, torch.Tensor]) -> None:
        self.base.observe(obs)
