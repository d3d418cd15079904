"""A camera's region of interest: the crop a policy's frames are cut to, the same in simulation and on a robot.

A crop is `(top, bottom, left, right)` as fractions of the frame (0 the top or left edge, 1 the bottom or right),
as HIL-SERL crops its wrist and side views to the part of the picture the task happens in. `crop_and_resize`
cuts it out of a [3, H, W] uint8 frame and area-resizes it to the policy's square image size: the simulated
env (`tasks/arm_task.py`, from a larger render) and the robot env (`hardware/robot_observation.py`, from a
camera's frame) both call it, so the policy sees the same region in both. Here, below both, since tasks/ must
not import hardware/.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

Crop = tuple[float, float, float, float]  # top, bottom, left, right: fractions of the frame


def check_crop(crop: object, where: str) -> Crop:
    """`crop` as a (top, bottom, left, right) tuple of floats, or ValueError naming `where` and the value: four
    finite numbers in [0, 1] with top < bottom and left < right."""
    if isinstance(crop, (str, bytes)) or not isinstance(crop, Sequence) or len(crop) != 4:
        raise ValueError(f"{where} must be [top, bottom, left, right] (fractions of the frame), got {crop!r}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in crop):
        raise ValueError(f"{where} must hold four finite numbers [top, bottom, left, right], got {list(crop)!r}")
    top, bottom, left, right = (float(v) for v in crop)
    if not all(0.0 <= v <= 1.0 for v in (top, bottom, left, right)):
        raise ValueError(f"{where} holds fractions of the frame, each in [0, 1]; got {list(crop)!r}")
    if not (top < bottom and left < right):
        raise ValueError(f"{where} must have top < bottom and left < right, got {list(crop)!r}")
    return top, bottom, left, right


def check_camera_crops(crops: object, cameras: Sequence[str], where: str) -> dict[str, Crop]:
    """`crops` (camera -> [top, bottom, left, right]) checked: a mapping whose every key is one of `cameras`
    and every value a crop; ValueError naming `where.<camera>` otherwise."""
    if not isinstance(crops, Mapping):
        raise ValueError(f"{where} must map camera names to [top, bottom, left, right], got {crops!r}")
    unknown = sorted(str(name) for name in crops if name not in cameras)
    if unknown:
        raise ValueError(f"{where} names cameras {unknown} that are not observed (cameras: {list(cameras)})")
    return {name: check_crop(crop, f"{where}.{name}") for name, crop in crops.items()}


def crop_box(crop: Crop | Sequence[float] | None, height: int, width: int) -> tuple[int, int, int, int]:
    """The crop's pixel rows [y0, y1) and columns [x0, x1) in a height x width frame: each edge rounded to the
    nearest pixel, at least one pixel kept each way."""
    if crop is None:
        return 0, height, 0, width
    top, bottom, left, right = crop
    y0 = min(math.floor(top * height + 0.5), height - 1)
    x0 = min(math.floor(left * width + 0.5), width - 1)
    y1 = max(math.floor(bottom * height + 0.5), y0 + 1)
    x1 = max(math.floor(right * width + 0.5), x0 + 1)
    return y0, y1, x0, x1


def crop_and_resize(pixels: torch.Tensor, crop: Crop | Sequence[float] | None, size: int) -> torch.Tensor:
    """`pixels` ([3, H, W] uint8, or [N, 3, H, W]) cut to `crop` (None: the whole frame) and area-resized to
    [3, size, size] (or [N, 3, size, size]) uint8. A frame already of that size and uncropped is returned as is."""
    if not isinstance(pixels, torch.Tensor) or pixels.dtype != torch.uint8 or pixels.ndim not in (3, 4):
        what = f"{pixels.dtype} {tuple(pixels.shape)}" if isinstance(pixels, torch.Tensor) else type(pixels).__name__
        raise ValueError(f"crop_and_resize takes a [3, H, W] or [N, 3, H, W] uint8 tensor, got {what}")
    if pixels.shape[-3] != 3 or pixels.shape[-2] < 1 or pixels.shape[-1] < 1:
        raise ValueError(f"crop_and_resize takes three-channel frames, got shape {tuple(pixels.shape)}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"crop_and_resize: size must be an integer >= 1, got {size!r}")
    if crop is not None:
        crop = check_crop(crop, "crop")
    height, width = pixels.shape[-2:]
    y0, y1, x0, x1 = crop_box(crop, height, width)
    region = pixels[..., y0:y1, x0:x1]
    if region.shape[-2:] == (size, size):
        return region.contiguous()
    batch = region.unsqueeze(0) if region.ndim == 3 else region
    resized = torch.nn.functional.interpolate(batch.float(), size=(size, size), mode="area")
    resized = resized.round().clamp(0, 255).to(torch.uint8)
    return resized[0] if pixels.ndim == 3 else resized


def render_size(crop: Crop | Sequence[float] | None, size: int, limit: int) -> int:
    """The square size to render a camera at so that its crop, resized to `size`, is downsampled (never
    stretched): ceil(size / the crop's smaller side fraction), at most `limit` (and never below `size`)."""
    if crop is None:
        return size
    top, bottom, left, right = crop
    fraction = min(bottom - top, right - left)
    return max(size, min(limit, math.ceil(size / fraction - 1e-9)))
