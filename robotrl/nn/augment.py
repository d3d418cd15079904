"""Image augmentation for pixel agents."""

from __future__ import annotations

import torch


def random_shift(images: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's random shift: translate each image by an integer offset in [-pad, pad] on both axes,
    filling from the replicated border (as padding by `pad` and cropping back at a random corner).

    Works on uint8 as well as float [B, C, H, W] (shifting the uint8 frames before conversion moves 4x
    fewer bytes); each image in the batch gets its own offset.
    """
    if images.dim() != 4:
        raise ValueError(f"random_shift expects [B, C, H, W] images, got shape {list(images.shape)}")
    if pad < 0:
        raise ValueError(f"random_shift pad must be >= 0, got {pad}")
    if pad == 0:
        return images
    batch, channels, height, width = images.shape
    offsets = torch.randint(-pad, pad + 1, (batch, 2), device=images.device, generator=generator)
    rows = (torch.arange(height, device=images.device) + offsets[:, :1]).clamp_(0, height - 1)  # [B, H]
    cols = (torch.arange(width, device=images.device) + offsets[:, 1:]).clamp_(0, width - 1)  # [B, W]
    shifted = images.gather(2, rows.view(batch, 1, height, 1).expand(batch, channels, height, width))
    return shifted.gather(3, cols.view(batch, 1, 1, width).expand(batch, channels, height, width))
