"""Image augmentation for pixel agents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def random_shift(images: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's random shift: translate each image by an integer offset in [-pad, pad] on both axes,
    filling from the replicated border (pad by `pad`, crop back at a random corner). Offsets are drawn
    on the CPU from `generator` (or torch's global RNG).

    Works on uint8 as well as float [B, C, H, W] (shifting the uint8 frames before conversion moves 4x
    fewer bytes); each image in the batch gets its own offset.
    """
    if images.dim() != 4:
        raise ValueError(f"random_shift expects [B, C, H, W] images, got shape {list(images.shape)}")
    if pad < 0:
        raise ValueError(f"random_shift pad must be >= 0, got {pad}")
    if pad == 0:
        return images
    batch, _, height, width = images.shape
    # replicate-pad once (two concatenations), then copy one crop per image: a strided copy per image beats
    # a batched gather, which reads every byte through an index
    padded = torch.cat(
        [images[:, :, :1].expand(-1, -1, pad, -1), images, images[:, :, -1:].expand(-1, -1, pad, -1)], dim=2
    )
    padded = torch.cat(
        [padded[..., :1].expand(-1, -1, -1, pad), padded, padded[..., -1:].expand(-1, -1, -1, pad)], dim=3
    )
    corners = torch.randint(0, 2 * pad + 1, (batch, 2), generator=generator).tolist()
    shifted = torch.empty_like(images)
    for b, (top, left) in enumerate(corners):
        shifted[b] = padded[b, :, top : top + height, left : left + width]
    return shifted


def shift_images(obs: Mapping[str, torch.Tensor], keys: Sequence[str], pad: int) -> dict[str, torch.Tensor]:
    """A copy of the observation dict with each image entry in `keys` randomly shifted (own offsets)."""
    out = dict(obs)
    for key in keys:
        out[key] = random_shift(obs[key], pad)
    return out
