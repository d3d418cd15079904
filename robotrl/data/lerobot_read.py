"""Reading a LeRobotDataset v3.0 into robotrl Episodes: one exported by robotrl (exactly), or a foreign one.

A foreign dataset's observation features become robotrl entries by name: `observation.images.<camera>`
(videos) -> `pixels_<camera>` ([C, H, W] uint8), `observation.state` -> `state`, or, where every entry is
named `<key>.<i>` (as robotrl exports), one entry per key; any other `observation.<name>` -> `<name>`
(flattened to float32). Given a task's obs spec and action size, a feature the task lacks, a task
observation with no feature, or a different shape is refused naming the feature. LeRobot stores no frame for
an episode's final observation: a foreign episode of N frames becomes N steps whose final observation
repeats the last frame's (as LeRobot's own replay buffer does); without `next.done` its last step is truncated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from robotrl.core.spec import TensorSpec
from robotrl.data import lerobot_format as fmt
from robotrl.data.dataset import (
    DTYPES,
    INDEX_FILE,
    DatasetError,
    Episode,
    EpisodeDataset,
    check_metadata,
    obs_spec_from_json,
)
from robotrl.data.lerobot_episodes import read_episodes
from robotrl.data.lerobot_format import ROBOTRL_FORMAT, ROBOTRL_PATH, ObsSource

LEROBOT_PREFIX = "lerobot:"  # in hil.demos: a LeRobot dataset directory rather than a robotrl one
_INDEXED_NAME = re.compile(r"(.+)\.(\d+)")


@dataclass
class LeRobotEpisodes:
    """A LeRobot dataset read into memory, with what `hil.demos` needs of a dataset."""

    root: Path
    obs_spec: dict[str, TensorSpec]
    action_dim: int
    metadata: dict[str, str]
    episodes: list[Episode] = field(repr=False)

    def __len__(self) -> int:
        return len(self.episodes)

    def __iter__(self) -> Iterator[Episode]:
        return iter(self.episodes)

    @property
    def num_steps(self) -> int:
        return sum(len(e) for e in self.episodes)

    def load_all(self) -> list[Episode]:
        return list(self.episodes)


def import_lerobot(
    source: str | Path,
    root: str | Path,
    *,
    obs_spec: Mapping[str, TensorSpec] | None = None,
    action_dim: int | None = None,
    ignore_features: Sequence[str] = (),
    action_low: Sequence[float] | None = None,
    action_high: Sequence[float] | None = None,
    metadata: Mapping[str, str] | None = None,
    exist_ok: bool = False,
) -> EpisodeDataset:
    """Read the LeRobot dataset at `source` into a robotrl dataset at `root` (see read_lerobot for the rest).

    Every episode is read and checked before the first is written. `metadata` adds to the dataset's; with
    `exist_ok` the episodes are appended to a matching dataset.
    """
    extra = check_metadata("metadata", metadata if metadata is not None else {})
    if not exist_ok and (Path(root) / INDEX_FILE).exists():
        raise DatasetError(Path(root) / INDEX_FILE, "a dataset already exists here; pass exist_ok=True to append to it")
    read = read_lerobot(
        source,
        obs_spec=obs_spec,
        action_dim=action_dim,
        ignore_features=ignore_features,
        action_low=action_low,
        action_high=action_high,
    )
    target = EpisodeDataset.create(root, read.obs_spec, read.action_dim, read.metadata | extra, exist_ok=exist_ok)
    for episode in read:
        target.append(episode)
    return target


def read_lerobot(
    source: str | Path,
    *,
    obs_spec: Mapping[str, TensorSpec] | None = None,
    action_dim: int | None = None,
    ignore_features: Sequence[str] = (),
    action_low: Sequence[float] | None = None,
    action_high: Sequence[float] | None = None,
) -> LeRobotEpisodes:
    """The episodes of the LeRobot v3 dataset directory `source` (a `lerobot:` prefix is allowed).

    With `obs_spec` and `action_dim` (a task's, per camera frame), the dataset must hold exactly those
    observations and that action size; `ignore_features` names observation features to leave out. Actions
    must lie in [-1, 1], or be mapped onto it affinely from `action_low`/`action_high` (the dataset's units).
    """
    root = Path(str(source).removeprefix(LEROBOT_PREFIX))
    info = fmt.read_info(root)
    features, fps = info["features"], int(info["fps"])
    unknown = sorted(set(ignore_features) - set(features))
    if unknown:
        raise ValueError(f"ignore_features: {unknown[0]!r} is not a feature of {root} (it has {sorted(features)})")
    ours = _read_ours(root)
    layout = _our_layout(ours) if ours else _foreign_layout(root, features, ignore_features)
    if obs_spec is not None:
        layout = _match_task(root, layout, features, obs_spec, ignore_features)
    dim = _check_action_feature(root, features, action_dim)
    bounds = _action_bounds(action_low, action_high, dim)
    episodes = read_episodes(root, features, fps, layout, dim, bounds, ours)
    if ours:
        metadata = check_metadata(f"{root / ROBOTRL_PATH} metadata", ours.get("metadata", {}))
    else:
        metadata = {"source": "lerobot", "lerobot_path": str(root), "fps": str(fps)}
        if info.get("robot_type"):
            metadata["robot_type"] = str(info["robot_type"])
        if bounds is not None:
            metadata["action_rescaled"] = (
                f"actions mapped affinely from low={json.dumps(bounds[0].tolist())} "
                f"high={json.dumps(bounds[1].tolist())} onto [-1, 1]"
            )
    return LeRobotEpisodes(root, {k: s.spec for k, s in layout.items()}, dim, metadata, episodes)


def _read_ours(root: Path) -> dict | None:
    path = root / ROBOTRL_PATH
    if not path.is_file():
        return None
    try:
        ours = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable: {err}") from None
    if not isinstance(ours, dict) or ours.get("format") != ROBOTRL_FORMAT or ours.get("version") != 1:
        raise ValueError(f"{path}: not a robotrl export description (format {ROBOTRL_FORMAT!r}, version 1)")
    return ours


# -- which feature holds which observation ---------------------------------------------------------------
def _our_layout(ours: dict) -> dict[str, ObsSource]:
    spec = obs_spec_from_json(ours.get("obs_spec"))
    places = ours.get("obs_features")
    if not isinstance(places, dict) or set(places) != set(spec):
        raise ValueError(f"{ROBOTRL_PATH}: obs_features must name a feature for each of {sorted(spec)}")
    return {k: ObsSource(places[k]["feature"], spec[k], places[k]["start"], places[k]["stop"]) for k in spec}


def _foreign_layout(root: Path, features: dict, ignore: Sequence[str]) -> dict[str, ObsSource]:
    layout = {}
    for name, feature in features.items():
        if not name.startswith(fmt.OBS_PREFIX) or name in ignore:
            continue
        size = int(np.prod(feature["shape"]))
        if feature["dtype"] == "video":
            height, width, channels = _frame_shape(root, name, feature)
            camera = name.removeprefix(fmt.OBS_IMAGES) if name.startswith(fmt.OBS_IMAGES) else name
            layout[f"pixels_{camera}"] = ObsSource(name, TensorSpec((channels, height, width), torch.uint8))
        elif feature["dtype"] in ("image", "string", "language"):
            raise ValueError(
                f"{root}: feature {name!r} has dtype {feature['dtype']!r}, which robotrl does not read (videos and "
                "numbers only); pass ignore_features=[...] to leave it out"
            )
        elif name == fmt.OBS_STATE and _split_by_names(feature.get("names"), size):
            for key, (start, stop) in _split_by_names(feature["names"], size).items():
                layout[key] = ObsSource(name, TensorSpec((stop - start,)), start, stop)
        else:  # floats as float32, as the gymnasium adapter gives them; other numbers keep their dtype
            dtype = DTYPES.get(feature["dtype"], torch.float32)
            dtype = torch.float32 if dtype.is_floating_point else dtype
            layout[name.removeprefix(fmt.OBS_PREFIX)] = ObsSource(name, TensorSpec((size,), dtype))
    if not layout:
        raise ValueError(f"{root}: no observation features (observation.*) to read")
    return layout


def _split_by_names(names: object, size: int) -> dict[str, tuple[int, int]]:
    """Entries named `<key>.0`, `<key>.1`, ... in order, as robotrl exports them: key -> (start, stop); {} if
    the names do not all follow that pattern."""
    if not isinstance(names, list) or len(names) != size:
        return {}
    parts, spans = [_INDEXED_NAME.fullmatch(n) if isinstance(n, str) else None for n in names], {}
    for position, match in enumerate(parts):
        if match is None:
            return {}
        key, number = match.group(1), int(match.group(2))
        start, _ = spans.get(key, (position, position))
        if position - start != number or (key in spans and spans[key][1] != position):
            return {}
        spans[key] = (start, position + 1)
    return spans


def _frame_shape(root: Path, name: str, feature: dict) -> tuple[int, int, int]:
    shape, names = feature["shape"], feature.get("names")
    if len(shape) != 3:
        raise ValueError(f"{root}: video feature {name!r} has shape {shape}; expected [height, width, channels]")
    if isinstance(names, list) and names[:1] == ["channels"]:
        return shape[1], shape[2], shape[0]
    return shape[0], shape[1], shape[2]


def _match_task(root, layout, features, obs_spec, ignore) -> dict[str, ObsSource]:
    """The layout restricted to the task's observations; ValueError naming the feature that does not fit."""
    matched = {}
    for key, spec in obs_spec.items():
        if key not in layout:
            wanted = (
                fmt.OBS_IMAGES + fmt.camera_name(key)
                if spec.dtype == torch.uint8 and len(spec.shape) == 3
                else f"{fmt.OBS_PREFIX}{key}' or '{fmt.OBS_STATE}' entries named '{key}.<i>"
            )
            have = sorted(n for n in features if n.startswith(fmt.OBS_PREFIX))
            raise ValueError(
                f"LeRobot dataset {root}: no feature for the task's observation {key!r} (looked for '{wanted}'; "
                f"it has {have})"
            )
        source = layout[key]
        if source.spec.shape != tuple(spec.shape) or source.spec.dtype != spec.dtype:
            got = f"{list(source.spec.shape)} {str(source.spec.dtype).removeprefix('torch.')}"
            need = f"{list(spec.shape)} {str(spec.dtype).removeprefix('torch.')}"
            raise ValueError(
                f"LeRobot dataset {root}: feature {source.feature!r} gives the task's observation {key!r} as {got}, "
                f"the task needs {need}"
            )
        matched[key] = source
    for key, source in layout.items():
        if key not in obs_spec and source.feature not in ignore:
            raise ValueError(
                f"LeRobot dataset {root}: feature {source.feature!r} ({key!r}) is not an observation of the task "
                f"(it has {sorted(obs_spec)}); pass ignore_features=[{source.feature!r}] to leave it out"
            )
    return matched


def _check_action_feature(root: Path, features: dict, action_dim: int | None) -> int:
    feature = features.get(fmt.ACTION)
    if feature is None or feature["dtype"] in ("video", "image", "string"):
        raise ValueError(f"LeRobot dataset {root}: no numeric feature 'action'")
    size = int(np.prod(feature["shape"]))
    if action_dim is not None and size != action_dim:
        raise ValueError(
            f"LeRobot dataset {root}: feature 'action' has {size} entries, the task's action_dim is {action_dim}"
        )
    return size


def _action_bounds(low, high, dim: int) -> tuple[np.ndarray, np.ndarray] | None:
    if low is None and high is None:
        return None
    if low is None or high is None:
        raise ValueError("action_low and action_high: give both or neither")
    low, high = np.asarray(low, np.float64).reshape(-1), np.asarray(high, np.float64).reshape(-1)
    if low.shape != (dim,) or high.shape != (dim,) or not np.all(np.isfinite(low) & np.isfinite(high) & (high > low)):
        raise ValueError(
            f"action_low/action_high: expected {dim} finite values each with high > low, got {low}, {high}"
        )
    return low, high
