"""The LeRobotDataset v3.0 layout: paths, features, statistics and parquet files (pyarrow, extra `lerobot-format`).

    meta/info.json                                 codebase_version "v3.0", fps, features, counts, path templates
    meta/stats.json                                per feature: min, max, mean, std, count, q01 ... q99
    meta/tasks.parquet                             task strings (the pandas index "task") -> task_index
    meta/episodes/chunk-000/file-000.parquet       one row per episode: length, where its rows and frames are
    data/chunk-000/file-000.parquet                one row per frame: every non-video feature
    videos/<camera feature>/chunk-000/file-000.mp4 the frames of consecutive episodes of one camera

Written from LeRobot's own source (src/lerobot/datasets/: utils.py, feature_utils.py, compute_stats.py,
dataset_writer.py, dataset_metadata.py). docs/dataset.md describes how robotrl's episodes map onto it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robotrl.core.spec import TensorSpec
from robotrl.data.lerobot_video import LEROBOT_EXTRA

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
CHUNKS_SIZE = 1000  # files per chunk directory
DATA_FILE_SIZE_IN_MB = 100
VIDEO_FILE_SIZE_IN_MB = 200
ROBOTRL_FORMAT = "robotrl.lerobot_export"  # robotrl's own files in an export, which LeRobot ignores:
ROBOTRL_PATH = "meta/robotrl.json"  # the obs spec, where each entry went, the metadata
FINAL_OBS_PATH = "meta/robotrl_final_observations.safetensors"  # each episode's final observation
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}

OBS_STATE = "observation.state"
OBS_IMAGES = "observation.images."
OBS_PREFIX = "observation."
ACTION = "action"
REWARD = "next.reward"
DONE = "next.done"
TRUNCATED = "next.truncated"
SUCCESS = "next.success"
INTERVENTION = "complementary_info.is_intervention"
INDEX_FEATURES = {  # LeRobot's DEFAULT_FEATURES: every dataset has them
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
STEP_FEATURES = {  # robotrl's per-step tensors, one frame per step
    REWARD: ("reward", "float32"),
    DONE: (None, "bool"),  # terminated or truncated, as LeRobot's gym_manipulator records it
    TRUNCATED: ("truncated", "bool"),
    SUCCESS: ("success", "bool"),
    INTERVENTION: ("intervention", "bool"),
}


@dataclass(frozen=True)
class ObsSource:
    """Where one robotrl observation entry comes from: a whole feature, or entries start:stop of it."""

    feature: str
    spec: TensorSpec
    start: int = 0
    stop: int | None = None  # None: the whole feature


def require_pyarrow():
    try:
        import pyarrow as pa  # an optional extra: only LeRobot import/export needs it
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(f"LeRobot datasets need pyarrow: pip install robotrl[{LEROBOT_EXTRA}] ({err})") from err
    return pa, pq


def next_file(chunk_index: int, file_index: int) -> tuple[int, int]:
    """The chunk and file after these: a chunk directory holds CHUNKS_SIZE files."""
    return (chunk_index + 1, 0) if file_index == CHUNKS_SIZE - 1 else (chunk_index, file_index + 1)


def camera_name(key: str) -> str:
    """robotrl names cameras `pixels_<camera>`; LeRobot `observation.images.<camera>`."""
    return key.removeprefix("pixels_") or key


# -- statistics ------------------------------------------------------------------------------------------
def feature_stats(values: np.ndarray, image: bool = False) -> dict[str, np.ndarray]:
    """LeRobot's statistics of one feature over frames: per entry for vectors ([N] or [N, D] in), per channel
    in [0, 1] with shape [C, 1, 1] for images ([N, H, W, C] uint8 in)."""
    if image:
        flat = values.reshape(-1, values.shape[-1]).astype(np.float64) / 255.0
    else:
        flat = values.reshape(values.shape[0], -1).astype(np.float64)
    stats = {
        "min": flat.min(axis=0),
        "max": flat.max(axis=0),
        "mean": flat.mean(axis=0),
        "std": flat.std(axis=0),
        **{name: np.quantile(flat, q, axis=0) for name, q in QUANTILES.items()},
    }
    if image:
        stats = {k: v.reshape(-1, 1, 1) for k, v in stats.items()}
    stats["count"] = np.array([values.shape[0]], dtype=np.int64)
    return stats


def aggregate_stats(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One feature's statistics over episodes, as LeRobot aggregates them: exact min, max, mean and std
    (weighted by count); quantiles as the envelope of the episodes' (min below the median, max above)."""
    counts = np.array([float(s["count"][0]) for s in per_episode])
    means = np.stack([s["mean"] for s in per_episode])
    weights = (counts / counts.sum()).reshape(-1, *([1] * (means.ndim - 1)))
    mean = (means * weights).sum(axis=0)
    variance = ((np.stack([s["std"] for s in per_episode]) ** 2 + (means - mean) ** 2) * weights).sum(axis=0)
    total = {
        "min": np.min([s["min"] for s in per_episode], axis=0),
        "max": np.max([s["max"] for s in per_episode], axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": np.array([int(counts.sum())], dtype=np.int64),
    }
    for name, q in QUANTILES.items():
        values = np.stack([s[name] for s in per_episode])
        total[name] = values.min(axis=0) if q <= 0.5 else values.max(axis=0)
    return total


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {feature: {k: v.tolist() for k, v in entry.items()} for feature, entry in stats.items()}


# -- parquet ---------------------------------------------------------------------------------------------
def column(values: np.ndarray, shape: list[int]):
    """A parquet column as LeRobot's feature types make it: a scalar for shape [1], a fixed-size list else."""
    pa, _ = require_pyarrow()
    if list(shape) == [1]:
        return pa.array(values.reshape(-1))
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, int(np.prod(shape)))


def column_values(table, name: str, shape: list[int], dtype: str, where: str) -> np.ndarray:
    """A column read back as [N, *shape] (or [N] for shape [1]); ValueError naming it if it does not fit."""
    pa, _ = require_pyarrow()
    if name not in table.column_names:
        raise ValueError(f"{where}: no column {name!r}, which meta/info.json lists as a feature")
    data = table.column(name).combine_chunks()
    rows = len(data)
    if pa.types.is_list(data.type) or pa.types.is_fixed_size_list(data.type) or pa.types.is_large_list(data.type):
        data = pa.compute.list_flatten(data)
    array = data.to_numpy(zero_copy_only=False)
    size = int(np.prod(shape))
    if array.size != rows * size:
        raise ValueError(f"{where}: column {name!r} does not hold {shape} values per row as meta/info.json says")
    array = array.astype(np.dtype(dtype), copy=False)
    return array.reshape(rows) if list(shape) == [1] else array.reshape(rows, *shape)


def write_tasks(root: Path, tasks: list[str]) -> None:
    """meta/tasks.parquet as pandas writes LeRobot's frame: a column task_index, the index `task`."""
    pa, pq = require_pyarrow()
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object", "metadata": None}
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }  # fmt: skip
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks, pa.string())})
    table = table.replace_schema_metadata({"pandas": json.dumps(pandas_meta)})
    pq.write_table(table, root / TASKS_PATH)


def read_tasks(root: Path) -> dict[int, str]:
    _, pq = require_pyarrow()
    path = root / TASKS_PATH
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; a LeRobot v3 dataset lists its tasks there")
    table = pq.read_table(path)
    if "task_index" not in table.column_names:
        raise ValueError(f"{path}: no column 'task_index'")
    names = "task" if "task" in table.column_names else "__index_level_0__"
    if names not in table.column_names:
        raise ValueError(f"{path}: no task strings (the index 'task')")
    return dict(zip(table.column("task_index").to_pylist(), table.column(names).to_pylist(), strict=True))


def read_parquet_dir(root: Path, directory: str):
    """Every `<directory>/chunk-*/file-*.parquet`, in order, as one table."""
    pa, pq = require_pyarrow()
    paths = sorted((root / directory).glob("chunk-*/file-*.parquet"))
    if not paths:
        raise FileNotFoundError(f"{root / directory}: no parquet files (chunk-XXX/file-XXX.parquet)")
    return pa.concat_tables([pq.read_table(p) for p in paths], promote_options="default")


def read_info(root: Path) -> dict:
    """meta/info.json, checked: a v3 codebase version, a positive fps, features with dtype and shape."""
    path = root / INFO_PATH
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; {root} is not a LeRobot dataset")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable: {err}") from None
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if not isinstance(version, str) or not version.startswith("v3."):
        raise ValueError(
            f"{path}: codebase_version {version!r} is not supported (v3.x only); convert a v2.1 dataset with "
            "LeRobot's `python -m lerobot.scripts.convert_dataset_v21_to_v30` first"
        )
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, int | float) or fps <= 0 or fps != int(fps):
        raise ValueError(f"{path}: fps must be a positive whole number, got {fps!r}")
    features = info.get("features")
    if not isinstance(features, dict) or not features:
        raise ValueError(f"{path}: features must be a non-empty object, got {features!r}")
    for name, feature in features.items():
        shape = feature.get("shape") if isinstance(feature, dict) else None
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 1 for n in shape):
            raise ValueError(f"{path}: feature {name!r} needs a dtype and a shape of positive ints, got {feature!r}")
        if not isinstance(feature.get("dtype"), str):
            raise ValueError(f"{path}: feature {name!r} needs a dtype, got {feature!r}")
    return info
