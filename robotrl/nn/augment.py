"""Image augmentation for pixel agents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def random_shift(images: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's random shift: translate each image by an integer offset in [-pad, pad] on both axes,
    filling from the replicated border (pad by `pad`, crop back at a random corner). Offsets are drawn
    from `generator` (or torch's global RNG): on the images' device, or on the CPU when `generator` is a
    CPU generator.

    Works on uint8 as well as float [B, C, H, W] (shifting the uint8 frames before conversion moves 4x
    fewer bytes); each image in the batch gets its own offset.
    """
    if images.dim() != 4:
        raise ValueError(f"random_shift expects [B, C, H, W] images, got shape {list(images.shape)}")
    if pad < 0:
        raise ValueError(f"random_shift pad must be >= 0, got {pad}")
    if pad == 0:
        return images
    padded = torch.cat(
        [images[:, :, :1].expand(-1, -1, pad, -1), images, images[:, :, -1:].expand(-1, -1, pad, -1)], dim=2
    )
    padded = torch.cat(
        [padded[..., :1].expand(-1, -1, -1, pad), padded, padded[..., -1:].expand(-1, -1, -1, pad)], dim=3
    )
    corner_device = generator.device if generator is not None else images.device
    corners = torch.randint(0, 2 * pad + 1, (images.shape[0], 2), generator=generator, device=corner_device)
    if images.device.type == "cpu":
        return crop_each(padded, corners.cpu(), images.shape[-2:])
    return crop_gathered(padded, corners.to(images.device, non_blocking=True), images.shape[-2:])


def crop_each(padded: torch.Tensor, corners: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """[B, C, h, w] crops of `padded` at per-image `corners` [B, 2] (top, left), one strided copy per image:
    on a CPU this beats a batched gather, which reads every byte through an index."""
    height, width = size
    shifted = padded.new_empty(padded.shape[0], padded.shape[1], height, width)
    for b, (top, left) in enumerate(corners.tolist()):
        shifted[b] = padded[b, :, top : top + height, left : left + width]
    return shifted


def crop_gathered(padded: torch.Tensor, corners: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """The same crops as `crop_each` in one indexing kernel and without a host sync: on a GPU the
    per-image loop costs a launch per image (512 per DrQ-v2 update)."""
    height, width = size
    batch = torch.arange(padded.shape[0], device=padded.device)[:, None, None]
    rows = corners[:, 0, None, None] + torch.arange(height, device=padded.device)[None, :, None]
    cols = corners[:, 1, None, None] + torch.arange(width, device=padded.device)[None, None, :]
    # advanced indices around a slice put the indexed dims first: [B, h, w, C]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()


def shift_images(obs: Mapping[str, torch.Tensor], keys: Sequence[str], pad: int) -> dict[str, torch.Tensor]:
    """A copy of the observation dict with each image entry in `keys` randomly shifted (own offsets)."""
    out = dict(obs)
    for key in keys:
        out[key] = random_shift(obs[key], pad)
    return out
