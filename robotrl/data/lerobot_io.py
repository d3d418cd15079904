"""LeRobotDataset v3.0 export and import of EpisodeDatasets (needs `pip install robotrl[lerobot-format]`).

Export writes one LeRobot frame per robotrl step: the observation before the step, the action executed, and
`next.reward`, `next.done` (terminated or truncated), `next.truncated`, `next.success` and
`complementary_info.is_intervention` of the step. Float32 vector observations are concatenated in obs-spec
order into `observation.state` (entry names `<key>.<i>`), camera images ([C, H, W] uint8) become the video
features `observation.images.<camera>`, other entries `observation.<key>` (flattened). LeRobot has no frame
for an episode's final observation; it goes, with the obs spec and metadata, into meta/robotrl.json and
meta/robotrl_final_observations.safetensors, which LeRobot ignores, so an export imports back unchanged
(pixels too, with the default lossless video). Import (robotrl/data/lerobot_read.py) reads both.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from robotrl.core.spec import TensorSpec, pixel_keys
from robotrl.data import lerobot_format as fmt
from robotrl.data.dataset import Episode, EpisodeDataset, obs_spec_to_json
from robotrl.data.lerobot_format import FINAL_OBS_PATH, ROBOTRL_FORMAT, ROBOTRL_PATH
from robotrl.data.lerobot_read import LEROBOT_PREFIX, LeRobotEpisodes, import_lerobot, read_lerobot
from robotrl.data.lerobot_video import VIDEO_SETTINGS, VideoWriter, video_info

__all__ = ["LEROBOT_PREFIX", "LeRobotEpisodes", "export_lerobot", "import_lerobot", "read_lerobot"]


@dataclass(frozen=True)
class _ObsFeature:
    """One LeRobot observation feature and the robotrl entries it holds."""

    name: str
    keys: tuple[str, ...]
    dtype: str  # a numpy dtype name, or "video"
    shape: tuple[int, ...]  # LeRobot's: [D] for vectors, [H, W, C] for videos
    names: list[str] | None


def _obs_features(obs_spec: Mapping[str, TensorSpec]) -> list[_ObsFeature]:
    cameras = pixel_keys(obs_spec)
    state = [k for k, s in obs_spec.items() if s.dtype == torch.float32 and len(s.shape) == 1 and k not in cameras]
    features = []
    if state:
        names = [f"{k}.{i}" for k in state for i in range(obs_spec[k].shape[0])]
        features.append(_ObsFeature(fmt.OBS_STATE, tuple(state), "float32", (len(names),), names))
    for key in cameras:
        channels, height, width = obs_spec[key].shape
        if channels != 3:
            raise ValueError(
                f"obs_spec[{key!r}]: LeRobot videos hold RGB images [3, H, W], got {list(obs_spec[key].shape)}"
            )
        shape = (height, width, channels)
        features.append(
            _ObsFeature(fmt.OBS_IMAGES + fmt.camera_name(key), (key,), "video", shape, ["height", "width", "channels"])
        )
    for key, spec in obs_spec.items():
        if key not in state and key not in cameras:
            size = int(np.prod(spec.shape))
            features.append(
                _ObsFeature(fmt.OBS_PREFIX + key, (key,), str(spec.dtype).removeprefix("torch."), (size,), None)
            )
    taken = [f.name for f in features]
    clash = sorted({n for n in taken if taken.count(n) > 1})
    if clash:
        raise ValueError(f"obs_spec: entries map onto the same LeRobot feature {clash[0]!r}; rename one of them")
    return features


def export_lerobot(
    dataset: EpisodeDataset,
    root: str | Path,
    *,
    fps: int,
    task: str | None = None,
    video: str = "lossless",
    robot_type: str | None = None,
) -> Path:
    """Write `dataset` as a LeRobotDataset v3.0 at `root` (a new or empty directory); returns `root`.

    `fps`: the control rate the episodes were recorded at (LeRobot's timestamps are frame / fps). `task`:
    the task string of every episode (default: the dataset's `metadata["task"]`). `video`: how camera frames
    are encoded, one of VIDEO_SETTINGS ("lossless" by default). Every episode is verified first, and a failed
    export removes what it wrote.
    """
    if not isinstance(dataset, EpisodeDataset):
        raise TypeError(f"dataset: expected an EpisodeDataset, got {type(dataset).__name__}")
    if isinstance(fps, bool) or not isinstance(fps, int) or fps < 1:
        raise ValueError(f"fps: expected an int >= 1 (the recording's control rate), got {fps!r}")
    if video not in VIDEO_SETTINGS:
        raise ValueError(f"video: expected one of {sorted(VIDEO_SETTINGS)}, got {video!r}")
    task = dataset.metadata.get("task", "robotrl episode") if task is None else task
    if not isinstance(task, str) or not task:
        raise ValueError(f"task: expected a non-empty str, got {task!r}")
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root}: exists and is not an empty directory; choose a new one")
    if len(dataset) == 0:
        raise ValueError(f"{dataset.root}: the dataset has no episodes to export")
    obs_features = _obs_features(dataset.obs_spec)
    settings = VIDEO_SETTINGS[video]
    for feature in obs_features:
        if feature.dtype == "video" and settings.even_size and any(n % 2 for n in feature.shape[:2]):
            raise ValueError(f"{feature.name}: video={video!r} needs an even height and width, got {feature.shape}")
    fmt.require_pyarrow()
    for _ in dataset:
        pass  # a first pass that only verifies: a corrupt file stops the export before anything is written
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    try:
        _Export(root, dataset, obs_features, fps, video).run(task, robot_type)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        if not created:
            root.mkdir(parents=True, exist_ok=True)  # it was an empty directory: leave it so
        raise
    return root


class _Export:
    """Writes one export: data and video files roll over to the next file at LeRobot's size limits."""

    def __init__(self, root: Path, dataset: EpisodeDataset, obs_features: list[_ObsFeature], fps: int, video: str):
        self.root, self.dataset, self.obs_features, self.fps, self.video = root, dataset, obs_features, fps, video
        self.features = self._features()
        self.data_file = (0, 0)
        self.data_writer = None
        self.data_bytes = 0
        self.videos: dict[str, tuple[tuple[int, int], VideoWriter]] = {}
        self.video_infos: dict[str, dict] = {}

    def _features(self) -> dict[str, dict]:
        features = {}
        for f in self.obs_features:
            features[f.name] = {"dtype": f.dtype, "shape": list(f.shape), "names": f.names}
        dim = self.dataset.action_dim
        features[fmt.ACTION] = {"dtype": "float32", "shape": [dim], "names": [f"action.{i}" for i in range(dim)]}
        for name, (_, dtype) in fmt.STEP_FEATURES.items():
            features[name] = {"dtype": dtype, "shape": [1], "names": None}
        return features | fmt.INDEX_FEATURES

    def run(self, task: str, robot_type: str | None) -> None:
        episodes_meta, episode_stats, finals, metadata, frames = [], [], [], [], 0
        for index, episode in enumerate(self.dataset):
            values = self._frame_values(episode, index, frames)
            row = {"episode_index": index, "tasks": [task], "length": len(episode)}
            row |= self._write_data(values, frames)
            for feature in self.obs_features:
                if feature.dtype == "video":
                    images = episode.obs[feature.keys[0]][:-1].permute(0, 2, 3, 1).numpy()
                    values[feature.name] = images
                    row |= self._write_video(feature, images)
            stats = {
                name: fmt.feature_stats(v, image=self.features[name]["dtype"] == "video") for name, v in values.items()
            }
            row |= {f"stats/{name}/{k}": v.tolist() for name, s in stats.items() for k, v in s.items()}
            row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
            episodes_meta.append(row)
            episode_stats.append(stats)
            finals.append({k: v[-1] for k, v in episode.obs.items()})
            metadata.append(episode.metadata)
            frames += len(episode)
        self._close()
        self._write_meta(episodes_meta, episode_stats, task, robot_type, frames)
        self._write_robotrl_files(finals, metadata)

    def _frame_values(self, episode: Episode, episode_index: int, first_frame: int) -> dict[str, np.ndarray]:
        length = len(episode)
        values = {}
        for f in self.obs_features:
            if f.dtype != "video":
                parts = [episode.obs[k][:-1].reshape(length, -1) for k in f.keys]
                values[f.name] = torch.cat(parts, dim=1).numpy()
        values[fmt.ACTION] = episode.action.numpy()
        for name, (field, _) in fmt.STEP_FEATURES.items():
            values[name] = (
                episode.terminated | episode.truncated if field is None else getattr(episode, field)
            ).numpy()
        frame_index = np.arange(length, dtype=np.int64)
        values["timestamp"] = (frame_index / self.fps).astype(np.float32)
        values["frame_index"] = frame_index
        values["episode_index"] = np.full(length, episode_index, dtype=np.int64)
        values["index"] = first_frame + frame_index
        values["task_index"] = np.zeros(length, dtype=np.int64)
        return values

    def _write_data(self, values: dict[str, np.ndarray], first_frame: int) -> dict:
        pa, pq = fmt.require_pyarrow()
        columns = {name: fmt.column(v, self.features[name]["shape"]) for name, v in values.items()}
        table = pa.table(columns)
        if self.data_writer is not None and self.data_bytes + table.nbytes > fmt.DATA_FILE_SIZE_IN_MB * 2**20:
            self.data_writer.close()
            self.data_writer, self.data_bytes = None, 0
            self.data_file = fmt.next_file(*self.data_file)
        if self.data_writer is None:
            path = self.root / fmt.DATA_PATH.format(chunk_index=self.data_file[0], file_index=self.data_file[1])
            path.parent.mkdir(parents=True, exist_ok=True)
            self.data_writer = pq.ParquetWriter(path, table.schema, compression="snappy")
        self.data_writer.write_table(table)
        self.data_bytes += table.nbytes
        length = len(values["index"])
        return {
            "data/chunk_index": self.data_file[0],
            "data/file_index": self.data_file[1],
            "dataset_from_index": first_frame,
            "dataset_to_index": first_frame + length,
        }

    def _write_video(self, feature: _ObsFeature, images: np.ndarray) -> dict:
        position, writer = self.videos.get(feature.name, (None, None))
        if writer is not None and writer.size_bytes() >= fmt.VIDEO_FILE_SIZE_IN_MB * 2**20:
            writer.close()
            position, writer = fmt.next_file(*position), None
        if writer is None:
            position = position or (0, 0)
            path = self.root / fmt.VIDEO_PATH.format(
                video_key=feature.name, chunk_index=position[0], file_index=position[1]
            )
            height, width, _ = feature.shape
            writer = VideoWriter(path, self.fps, height, width, VIDEO_SETTINGS[self.video])
            self.videos[feature.name] = (position, writer)
        start = writer.frames_written
        writer.add(images)
        prefix = f"videos/{feature.name}/"
        return {
            prefix + "chunk_index": position[0],
            prefix + "file_index": position[1],
            prefix + "from_timestamp": start / self.fps,
            prefix + "to_timestamp": writer.frames_written / self.fps,
        }

    def _close(self) -> None:
        if self.data_writer is not None:
            self.data_writer.close()
        for name, (_, writer) in self.videos.items():
            writer.close()
            self.video_infos[name] = video_info(writer.path)

    def _write_meta(self, episodes_meta, episode_stats, task, robot_type, frames) -> None:
        pa, pq = fmt.require_pyarrow()
        for name, info in self.video_infos.items():
            self.features[name]["info"] = info
        path = self.root / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(episodes_meta), path)
        fmt.write_tasks(self.root, [task])
        stats = {name: fmt.aggregate_stats([s[name] for s in episode_stats]) for name in episode_stats[0]}
        _write_json(self.root / fmt.STATS_PATH, fmt.stats_to_json(stats))
        info = {
            "codebase_version": fmt.CODEBASE_VERSION,
            "robot_type": robot_type,
            "total_episodes": len(episodes_meta),
            "total_frames": frames,
            "total_tasks": 1,
            "chunks_size": fmt.CHUNKS_SIZE,
            "data_files_size_in_mb": fmt.DATA_FILE_SIZE_IN_MB,
            "video_files_size_in_mb": fmt.VIDEO_FILE_SIZE_IN_MB,
            "fps": self.fps,
            "splits": {"train": f"0:{len(episodes_meta)}"},
            "data_path": fmt.DATA_PATH,
            "video_path": fmt.VIDEO_PATH if self.videos else None,
            "features": self.features,
        }
        _write_json(self.root / fmt.INFO_PATH, info)

    def _write_robotrl_files(self, finals: list[dict[str, torch.Tensor]], metadata: list[dict[str, str]]) -> None:
        layout = {}
        for feature in self.obs_features:
            start = 0
            for key in feature.keys:
                size = int(np.prod(self.dataset.obs_spec[key].shape))
                layout[key] = {"feature": feature.name, "start": start, "stop": start + size}
                start += size
        extra = {
            "format": ROBOTRL_FORMAT,
            "version": 1,
            "obs_spec": obs_spec_to_json(self.dataset.obs_spec),
            "obs_features": layout,
            "action_dim": self.dataset.action_dim,
            "metadata": self.dataset.metadata,
            "episode_metadata": metadata,
        }
        _write_json(self.root / ROBOTRL_PATH, extra)
        stacked = {key: torch.stack([f[key] for f in finals]).contiguous() for key in self.dataset.obs_spec}
        safetensors.torch.save_file(stacked, self.root / FINAL_OBS_PATH)


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4), encoding="utf-8")
