"""The frames of a LeRobotDataset v3.0 cut into robotrl Episodes, one LeRobot episode each.

Rows come from data/*/*.parquet, grouped by `episode_index` and ordered by `frame_index`; camera frames from
each episode's span of its video file (`from_timestamp` * fps on). Everything is checked against
meta/info.json and meta/episodes, and errors name the file, the episode and the feature.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from robotrl.data import lerobot_format as fmt
from robotrl.data.dataset import Episode, check_metadata
from robotrl.data.lerobot_video import decode_video

ACTION_TOLERANCE = 1e-5  # rescaled actions this close outside [-1, 1] are rounding, and are clamped


def read_episodes(root: Path, features: dict, fps: int, layout: dict, action_dim: int, bounds, ours) -> list[Episode]:
    meta = fmt.read_parquet_dir(root, fmt.EPISODES_DIR)
    where = f"{root / fmt.EPISODES_DIR}"
    numbers = fmt.column_values(meta, "episode_index", [1], "int64", where)
    lengths = fmt.column_values(meta, "length", [1], "int64", where)
    data = fmt.read_parquet_dir(root, "data")
    rows = _rows_by_episode(root, data, numbers, lengths)
    needed = {s.feature for s in layout.values() if features[s.feature]["dtype"] != "video"}
    needed |= {fmt.ACTION} | {n for n in fmt.STEP_FEATURES if n in features}
    columns = {
        n: fmt.column_values(data, n, features[n]["shape"], features[n]["dtype"], f"{root}/data") for n in needed
    }
    finals = _final_observations(root, layout, len(numbers)) if ours else None
    episode_metadata = ours.get("episode_metadata") if ours else None
    if ours and (not isinstance(episode_metadata, list) or len(episode_metadata) != len(numbers)):
        raise ValueError(f"{root / fmt.ROBOTRL_PATH}: episode_metadata must list {len(numbers)} entries")
    videos = _VideoFrames(root, fps)
    episodes = []
    for position, (number, length) in enumerate(zip(numbers.tolist(), lengths.tolist(), strict=True)):
        where = f"LeRobot dataset {root} episode {number}"
        try:
            obs = {}
            for key, source in layout.items():
                if features[source.feature]["dtype"] == "video":
                    frames = videos.episode(meta, position, source.feature, length)
                    values = torch.from_numpy(frames).permute(0, 3, 1, 2)
                else:
                    flat = columns[source.feature][rows[number]].reshape(length, -1)
                    values = torch.from_numpy(np.ascontiguousarray(flat[:, source.start : source.stop]))
                values = values.reshape(length, *source.spec.shape).to(source.spec.dtype)
                last = finals[key][position : position + 1] if finals else values[-1:]
                obs[key] = torch.cat([values, last])
            steps = {n: torch.from_numpy(np.ascontiguousarray(v[rows[number]])) for n, v in columns.items()}
            metadata = (
                check_metadata("episode_metadata", episode_metadata[position])
                if ours
                else {"lerobot_episode_index": str(number)}
            )
            episode = _episode(obs, steps, length, action_dim, bounds, metadata, end_at_last=not ours)
            episode.validate({k: s.spec for k, s in layout.items()}, action_dim)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        episodes.append(episode)
    return episodes


def _rows_by_episode(root: Path, data, numbers: np.ndarray, lengths: np.ndarray) -> dict[int, np.ndarray]:
    """Each episode's data rows in frame order; ValueError unless they match meta/episodes."""
    where = f"{root}/data"
    episode_of = fmt.column_values(data, "episode_index", [1], "int64", where)
    frame_of = fmt.column_values(data, "frame_index", [1], "int64", where)
    order = np.lexsort((frame_of, episode_of))
    starts = np.searchsorted(episode_of[order], numbers, side="left")
    rows = {}
    for number, start, length in zip(numbers.tolist(), starts.tolist(), lengths.tolist(), strict=True):
        picked = order[start : start + length]
        if length < 1 or len(picked) != length or (episode_of[picked] != number).any():
            raise ValueError(f"{where}: episode {number} has fewer than the {length} frames meta/episodes lists")
        if not np.array_equal(frame_of[picked], np.arange(length)):
            raise ValueError(f"{where}: episode {number}'s frame_index is not 0..{length - 1}")
        rows[number] = picked
    if sum(lengths.tolist()) != len(episode_of):
        raise ValueError(f"{where}: {len(episode_of)} rows, meta/episodes lists {int(lengths.sum())} frames")
    return rows


class _VideoFrames:
    """Decodes each video file once and hands out episodes' spans of it."""

    def __init__(self, root: Path, fps: int):
        self.root, self.fps = root, fps
        self.files: dict[Path, np.ndarray] = {}

    def episode(self, meta, position: int, feature: str, length: int) -> np.ndarray:
        prefix, where = f"videos/{feature}/", f"{self.root / fmt.EPISODES_DIR}"
        chunk = int(fmt.column_values(meta, prefix + "chunk_index", [1], "int64", where)[position])
        file = int(fmt.column_values(meta, prefix + "file_index", [1], "int64", where)[position])
        start_time = float(fmt.column_values(meta, prefix + "from_timestamp", [1], "float64", where)[position])
        path = self.root / fmt.VIDEO_PATH.format(video_key=feature, chunk_index=chunk, file_index=file)
        if path not in self.files:
            if not path.is_file():
                raise ValueError(f"{path}: missing, and meta/episodes names it for {feature!r}")
            self.files[path] = decode_video(path, self.fps)
        frames, start = self.files[path], round(start_time * self.fps)
        if start + length > len(frames):
            raise ValueError(f"{path}: {len(frames)} frames; the episode needs frames {start} to {start + length - 1}")
        return frames[start : start + length]


def _final_observations(root: Path, layout: dict, count: int) -> dict[str, torch.Tensor]:
    path = root / fmt.FINAL_OBS_PATH
    try:
        finals = safetensors.torch.load_file(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable: {err}") from None
    for key, source in layout.items():
        if key not in finals or tuple(finals[key].shape) != (count, *source.spec.shape):
            raise ValueError(f"{path}: expected {key!r} of shape {[count, *source.spec.shape]}")
    return finals


def _episode(obs, steps, length, action_dim, bounds, metadata, end_at_last: bool) -> Episode:
    action = steps[fmt.ACTION].reshape(length, action_dim).to(torch.float64)
    if bounds is not None:
        low, high = (torch.from_numpy(b) for b in bounds)
        action = 2.0 * (action - low) / (high - low) - 1.0
    outside = (action.abs() > 1.0 + ACTION_TOLERANCE).any(-1)
    if outside.any():
        step = int(outside.nonzero()[0, 0])
        hint = "" if bounds is not None else "; give action_low/action_high to map them onto [-1, 1]"
        raise ValueError(f"feature 'action': frame {step} is outside [-1, 1]: {action[step].tolist()}{hint}")
    flags = {name: steps[n].reshape(length).to(torch.bool) for n, (name, _) in fmt.STEP_FEATURES.items() if n in steps}
    done = (
        steps[fmt.DONE].reshape(length).to(torch.bool) if fmt.DONE in steps else torch.zeros(length, dtype=torch.bool)
    )
    truncated = flags.get("truncated", torch.zeros(length, dtype=torch.bool))
    terminated = done & ~truncated
    if end_at_last and not (terminated[-1] or truncated[-1]):
        truncated = truncated.clone()
        truncated[-1] = True  # the recording stopped there
    zeros = torch.zeros(length, dtype=torch.bool)
    reward = steps[fmt.REWARD].reshape(length).float() if fmt.REWARD in steps else torch.zeros(length)
    return Episode(
        obs=obs,
        action=action.clamp(-1.0, 1.0).float(),
        reward=reward,
        terminated=terminated,
        truncated=truncated,
        success=flags.get("success", zeros),
        intervention=flags.get("intervention", zeros),
        metadata=metadata,
    )
