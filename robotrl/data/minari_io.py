"""Minari import and export of EpisodeDatasets (needs `pip install robotrl[datasets]`).

Export writes a Minari HDF5 dataset: observations as a Dict space of Boxes (uint8 images stored raw, not
JPEG), actions as Box(-1, 1), and per-step infos `success` and `intervention`. Minari's infos follow its
DataCollector, one entry per observation: entry 0 belongs to the reset, entry t+1 to step t. The robotrl
obs spec and metadata go into the dataset's metadata under `robotrl`, each episode's metadata into its
HDF5 attributes as `robotrl/<key>`, so an export imports back unchanged.

Import reads that back, or a foreign dataset with a Box or Dict-of-Box observation space and a Box action
space. Foreign observations take the gymnasium adapter's layout (tasks/gym_env.py): a Box becomes `state`,
a Dict keeps its keys, each flattened to float32, except uint8 images ([H, W, C] turned to [C, H, W]).
Actions from a Box other than [-1, 1] are rescaled affinely from its bounds; the metadata says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from robotrl.core.spec import TensorSpec
from robotrl.data.dataset import (
    INDEX_FILE,
    DatasetError,
    Episode,
    EpisodeDataset,
    check_metadata,
    obs_spec_from_json,
    obs_spec_to_json,
)

if TYPE_CHECKING:
    import minari

MINARI_ROOT_VAR = "MINARI_DATASETS_PATH"
ROBOTRL_KEY = "robotrl"  # our entry in the Minari dataset metadata, and the prefix of episode attributes
FOREIGN_BOX_KEY = "state"  # as tasks/gym_env.py names a Box observation
SUCCESS_INFO_KEYS = ("success", "is_success")
BOUND_TOLERANCE = 1e-5  # rescaled actions this close outside [-1, 1] are rounding, and are clamped


def _minari():
    try:
        import h5py  # noqa: F401  (Minari's HDF5 storage needs it, and says so only when first used)
        import minari
    except ImportError as err:
        raise ImportError(
            f"Minari import/export needs minari with h5py: pip install robotrl[datasets] ({err})"
        ) from err
    return minari


@contextmanager
def _datasets_root(data_path: str | Path | None) -> Iterator[None]:
    """Point Minari at `data_path` (its datasets root) for the duration; None keeps MINARI_DATASETS_PATH."""
    if data_path is None:
        yield
        return
    previous = os.environ.get(MINARI_ROOT_VAR)
    os.environ[MINARI_ROOT_VAR] = str(Path(data_path).resolve())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MINARI_ROOT_VAR, None)
        else:
            os.environ[MINARI_ROOT_VAR] = previous


def _dataset_dir(minari_module, dataset_id: str, data_path: str | Path | None) -> Path:
    if not isinstance(dataset_id, str):
        raise ValueError(f"dataset_id: expected a str such as 'robotrl/panda_reach/demos-v0', got {dataset_id!r}")
    minari_module.dataset.minari_dataset.parse_dataset_id(dataset_id)  # ValueError explaining the id format
    if data_path is not None:
        return Path(data_path) / dataset_id
    return Path(minari_module.storage.datasets_root_dir.get_dataset_path(dataset_id))


# -- export ----------------------------------------------------------------------------------------------
def export_minari(
    dataset: EpisodeDataset,
    dataset_id: str,
    *,
    env_id: str | None = None,
    data_path: str | Path | None = None,
) -> minari.MinariDataset:
    """Write `dataset` as the Minari dataset `dataset_id` under `data_path` (default: Minari's root).

    `env_id`, a registered gymnasium id (robotrl's tasks register theirs on `import robotrl.tasks`), is
    recorded as the dataset's env spec without building the env. Every episode is verified first.
    """
    minari_module = _minari()
    import gymnasium as gym

    if not isinstance(dataset, EpisodeDataset):
        raise TypeError(f"dataset: expected an EpisodeDataset, got {type(dataset).__name__}")
    target = _dataset_dir(minari_module, dataset_id, data_path)
    if target.exists():
        raise FileExistsError(f"{target}: a Minari dataset {dataset_id!r} exists already; choose another id or version")
    env_spec = _env_spec_json(env_id)
    if len(dataset) == 0:
        raise ValueError(f"{dataset.root}: the dataset has no episodes to export")
    for _ in dataset:
        pass  # a first pass that only verifies: a corrupt file stops the export before Minari writes anything

    observation_space = gym.spaces.Dict({k: _box_of(s) for k, s in dataset.obs_spec.items()})
    action_space = gym.spaces.Box(-1.0, 1.0, (dataset.action_dim,), np.float32)
    with _datasets_root(data_path), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Minari's reminders to name an author, a code link, ...
        created = minari_module.create_dataset_from_buffers(
            dataset_id,
            [],
            observation_space=observation_space,
            action_space=action_space,
            algorithm_name=dataset.metadata.get("source", "robotrl"),
            description=f"robotrl episode dataset exported from {dataset.root}",
            data_format="hdf5",
            jpeg_encoding=False,  # lossless: JPEG would change the pixels
        )
    storage = created.storage
    episode_metadata = []
    for episode in dataset:  # one episode in memory at a time
        storage.update_episodes([_episode_buffer(episode)])
        episode_metadata.append({f"{ROBOTRL_KEY}/{k}": v for k, v in episode.metadata.items()})
    storage.update_episode_metadata(episode_metadata)
    extra: dict[str, Any] = {
        ROBOTRL_KEY: {"obs_spec": obs_spec_to_json(dataset.obs_spec), "metadata": dataset.metadata}
    }
    if env_spec is not None:
        extra["env_spec"] = env_spec
    storage.update_metadata(extra)
    return minari_module.MinariDataset(storage.data_path)  # re-read, so the env spec added above is seen


def _episode_buffer(episode: Episode):
    from minari.data_collector import EpisodeBuffer

    return EpisodeBuffer(
        observations={k: v.numpy() for k, v in episode.obs.items()},
        actions=episode.action.numpy(),
        rewards=episode.reward.numpy(),
        terminations=episode.terminated.numpy(),
        truncations=episode.truncated.numpy(),
        infos={"success": _per_observation(episode.success), "intervention": _per_observation(episode.intervention)},
    )


def _env_spec_json(env_id: str | None) -> str | None:
    if env_id is None:
        return None
    import gymnasium as gym

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as err:
        raise ValueError(
            f"env_id {env_id!r} is not a registered gymnasium id ({err}); robotrl's tasks register theirs "
            "on `import robotrl.tasks`"
        ) from None
    if callable(spec.entry_point):  # gymnasium serializes only "module:attr" entry points
        entry = spec.entry_point
        spec = dataclasses.replace(spec, entry_point=f"{entry.__module__}:{entry.__qualname__}")
    try:
        return spec.to_json()
    except (ValueError, TypeError) as err:
        raise ValueError(f"env_id {env_id!r}: its gymnasium spec cannot be stored ({err})") from None


def _box_of(spec: TensorSpec):
    import gymnasium as gym

    dtype = np.dtype(str(spec.dtype).removeprefix("torch."))
    if dtype == np.uint8:
        return gym.spaces.Box(0, 255, spec.shape, np.uint8)
    if dtype == np.bool_:
        return gym.spaces.Box(0, 1, spec.shape, np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return gym.spaces.Box(info.min, info.max, spec.shape, dtype)
    return gym.spaces.Box(-np.inf, np.inf, spec.shape, dtype)


def _per_observation(flags: torch.Tensor) -> np.ndarray:
    """A per-step flag as Minari's per-observation info: False for the reset, then one per step."""
    return np.concatenate([np.zeros(1, dtype=bool), flags.numpy()])


# -- import ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ObsEntry:
    source: str | None  # the Dict space's key, None for a plain Box
    spec: TensorSpec
    layout: str  # "as_is", "flatten" (to float32) or "hwc_to_chw"


@dataclass(frozen=True)
class _Layout:
    """How a Minari dataset's arrays become an Episode's tensors."""

    obs: dict[str, _ObsEntry]
    action_shape: tuple[int, ...]
    action_low: np.ndarray | None  # rescale from [low, high] to [-1, 1]; None: already [-1, 1]
    action_high: np.ndarray | None

    @property
    def obs_spec(self) -> dict[str, TensorSpec]:
        return {k: e.spec for k, e in self.obs.items()}

    @property
    def action_dim(self) -> int:
        return int(np.prod(self.action_shape))


def import_minari(
    dataset_id: str,
    root: str | Path,
    *,
    data_path: str | Path | None = None,
    metadata: Mapping[str, str] | None = None,
    exist_ok: bool = False,
) -> EpisodeDataset:
    """Read the Minari dataset `dataset_id` (under `data_path`, default Minari's root) into a dataset at `root`.

    Every episode is converted and checked before the first is written, so bad input leaves `root` as it
    was. `metadata` adds to the dataset's; with `exist_ok` the episodes are appended to a matching dataset.
    """
    minari_module = _minari()
    source_dir = _dataset_dir(minari_module, dataset_id, data_path)
    if not (source_dir / "data").is_dir():
        raise FileNotFoundError(f"{source_dir}: no Minari dataset {dataset_id!r} there")
    extra = check_metadata("metadata", metadata if metadata is not None else {})
    if not exist_ok and (Path(root) / INDEX_FILE).exists():
        raise DatasetError(Path(root) / INDEX_FILE, "a dataset already exists here; pass exist_ok=True to append to it")
    source = minari_module.MinariDataset(source_dir / "data")
    raw_metadata = source.storage.metadata
    ours = raw_metadata.get(ROBOTRL_KEY)
    layout = _layout(dataset_id, source, ours)
    dataset_metadata = _imported_metadata(dataset_id, layout, ours) | extra

    for _ in _converted_episodes(dataset_id, source, layout, ours is not None):
        pass  # a first pass that only checks: nothing is written unless every episode converts
    target = EpisodeDataset.create(root, layout.obs_spec, layout.action_dim, dataset_metadata, exist_ok=exist_ok)
    for episode in _converted_episodes(dataset_id, source, layout, ours is not None):
        target.append(episode)
    return target


def _layout(dataset_id: str, source, ours: Mapping | None) -> _Layout:
    import gymnasium as gym

    obs_space, action_space = source.observation_space, source.action_space
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"Minari dataset {dataset_id!r}: action space {action_space} is not supported (Box only)")
    low, high = action_space.low.astype(np.float64).reshape(-1), action_space.high.astype(np.float64).reshape(-1)
    if np.array_equal(low, -np.ones_like(low)) and np.array_equal(high, np.ones_like(high)):
        action_low = action_high = None
    elif np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low):
        action_low, action_high = low, high
    else:
        raise ValueError(
            f"Minari dataset {dataset_id!r}: action space {action_space} has unbounded or empty dimensions; "
            "robotrl needs finite bounds to map actions onto [-1, 1]"
        )
    if ours is not None:
        obs = _our_obs_layout(dataset_id, obs_space, ours)
    elif isinstance(obs_space, gym.spaces.Box):
        obs = {FOREIGN_BOX_KEY: _foreign_entry(dataset_id, None, obs_space)}
    elif isinstance(obs_space, gym.spaces.Dict):
        obs = {key: _foreign_entry(dataset_id, key, sub) for key, sub in obs_space.spaces.items()}
    else:
        raise ValueError(
            f"Minari dataset {dataset_id!r}: observation space {obs_space} is not supported (Box or Dict of Box)"
        )
    return _Layout(obs, tuple(action_space.shape), action_low, action_high)


def _our_obs_layout(dataset_id: str, obs_space, ours: Mapping) -> dict[str, _ObsEntry]:
    try:
        spec = obs_spec_from_json(ours.get("obs_spec") if isinstance(ours, Mapping) else None)
    except ValueError as err:
        raise ValueError(f"Minari dataset {dataset_id!r}: invalid {ROBOTRL_KEY} metadata: {err}") from None
    if set(spec) != set(getattr(obs_space, "spaces", {})):
        raise ValueError(f"Minari dataset {dataset_id!r}: observation space {obs_space} does not match {sorted(spec)}")
    return {key: _ObsEntry(key, s, "as_is") for key, s in spec.items()}


def _foreign_entry(dataset_id: str, key: str | None, space) -> _ObsEntry:
    import gymnasium as gym

    name = "observation" if key is None else f"observation[{key!r}]"
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"Minari dataset {dataset_id!r}: {name} is {space}; only Box entries are supported")
    shape = tuple(space.shape)
    if space.dtype == np.uint8 and len(shape) == 3:
        if shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4):
            return _ObsEntry(key, TensorSpec((shape[2], shape[0], shape[1]), torch.uint8), "hwc_to_chw")
        return _ObsEntry(key, TensorSpec(shape, torch.uint8), "as_is")
    return _ObsEntry(key, TensorSpec((int(np.prod(shape)),)), "flatten")


def _imported_metadata(dataset_id: str, layout: _Layout, ours: Mapping | None) -> dict[str, str]:
    if ours is not None:
        stored = ours.get("metadata", {}) if isinstance(ours, Mapping) else {}
        return check_metadata(f"Minari dataset {dataset_id!r} {ROBOTRL_KEY} metadata", stored) | {
            "minari_dataset_id": dataset_id
        }
    metadata = {"source": "minari", "minari_dataset_id": dataset_id}
    if layout.action_low is not None:
        metadata["action_rescaled"] = (
            "actions mapped affinely from the Minari action space bounds onto [-1, 1]: "
            f"low={json.dumps(layout.action_low.tolist())} high={json.dumps(layout.action_high.tolist())}"
        )
    return metadata


def _converted_episodes(dataset_id: str, source, layout: _Layout, ours: bool) -> Iterator[Episode]:
    episode_attrs = list(source.storage.get_episode_metadata(source.episode_indices))
    for attrs, data in zip(episode_attrs, source.iterate_episodes(), strict=True):
        where = f"Minari dataset {dataset_id!r} episode {data.id}"
        try:
            episode = _episode(data, layout, _episode_metadata(attrs, data.id, ours))
            episode.validate(layout.obs_spec, layout.action_dim)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        yield episode


def _episode(data, layout: _Layout, metadata: dict[str, str]) -> Episode:
    length = len(data.rewards)
    obs = {key: _observation(data.observations, entry, length) for key, entry in layout.obs.items()}
    return Episode(
        obs=obs,
        action=_action(np.asarray(data.actions), layout, length),
        reward=torch.from_numpy(np.asarray(data.rewards, dtype=np.float32).reshape(-1)),
        terminated=_flags("terminations", data.terminations, length),
        truncated=_flags("truncations", data.truncations, length),
        success=_info_flag(data.infos, SUCCESS_INFO_KEYS, length),
        intervention=_info_flag(data.infos, ("intervention",), length),
        metadata=metadata,
    )


def _observation(observations, entry: _ObsEntry, length: int) -> torch.Tensor:
    name = "observations" if entry.source is None else f"observations[{entry.source!r}]"
    array = np.asarray(observations if entry.source is None else observations[entry.source])
    if array.ndim == 0 or array.shape[0] != length + 1:
        raise ValueError(f"{name}: expected {length + 1} observations (steps + 1), got shape {list(array.shape)}")
    if entry.layout == "flatten":
        array = array.reshape(length + 1, -1).astype(np.float32)
    elif entry.layout == "hwc_to_chw":
        array = array.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(array))


def _action(actions: np.ndarray, layout: _Layout, length: int) -> torch.Tensor:
    if actions.shape != (length, *layout.action_shape):
        raise ValueError(f"actions: expected shape {[length, *layout.action_shape]}, got {list(actions.shape)}")
    flat = actions.reshape(length, -1).astype(np.float64)
    if layout.action_low is not None:
        flat = 2.0 * (flat - layout.action_low) / (layout.action_high - layout.action_low) - 1.0
        outside = np.abs(flat) > 1.0 + BOUND_TOLERANCE
        if outside.any():
            step = int(np.argwhere(outside)[0, 0])
            raise ValueError(f"actions: step {step} is outside the action space bounds: {actions[step].tolist()}")
        flat = np.clip(flat, -1.0, 1.0)
    return torch.from_numpy(flat.astype(np.float32))


def _flags(name: str, values, length: int) -> torch.Tensor:
    array = np.asarray(values).reshape(-1)
    if array.shape != (length,):
        raise ValueError(f"{name}: expected {length} values, got shape {list(np.asarray(values).shape)}")
    return torch.from_numpy(array.astype(bool))


def _info_flag(infos, keys: tuple[str, ...], length: int) -> torch.Tensor:
    """A per-step flag from Minari infos (one per observation, or one per step); all False if absent."""
    for key in keys:
        if infos and key in infos:
            array = np.asarray(infos[key]).reshape(-1)
            if array.shape == (length + 1,):
                array = array[1:]  # entry 0 belongs to the reset
            return _flags(f"infos[{key!r}]", array, length)
    return torch.zeros(length, dtype=torch.bool)


def _episode_metadata(attrs: Mapping, episode_id: int, ours: bool) -> dict[str, str]:
    if ours:
        return {k: str(v) for k, v in _flatten(attrs.get(ROBOTRL_KEY, {})).items()}
    metadata = {"minari_episode_id": str(episode_id)}
    if attrs.get("seed") is not None:
        metadata["seed"] = str(attrs["seed"])
    return metadata


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """Undo Minari's split of attribute names at '/', so metadata keys holding '/' come back whole."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat
