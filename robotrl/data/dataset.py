"""Episodes on disk: demonstrations, operator interventions and policy rollouts, one safetensors file each.

    root/dataset.json                          the index: format, obs spec, action_dim, metadata, episodes
    root/episodes/episode_000000.safetensors   one episode: obs.<key>, action, reward, terminated, ...

docs/dataset.md describes the files for readers without robotrl. An append writes the episode file
(temporary name, fsync, rename) before the index that names it, and the index the same way, so a crash at
any moment leaves the previous dataset readable; a file the index does not name is ignored and replaced by
the next append. One process appends to a dataset at a time. Loads check each file's sha256 and contents
before handing anything back. Nothing is pickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch

from robotrl.core.checksum import SHA256_HEX, mismatch_problem, sha256_of_bytes
from robotrl.core.durable import write_atomic
from robotrl.core.env import ACTION_TOLERANCE, StepResult
from robotrl.core.spec import TensorSpec

FORMAT_NAME = "robotrl.episode_dataset"
FORMAT_VERSION = 1
INDEX_FILE = "dataset.json"
EPISODE_DIR = "episodes"
STEP_TENSORS = ("action", "reward", "terminated", "truncated", "success", "intervention")
FLAG_TENSORS = ("terminated", "truncated", "success", "intervention")
DTYPES = {
    name: getattr(torch, name)
    for name in ("float16", "float32", "float64", "uint8", "int8", "int16", "int32", "int64", "bool")
}
_EPISODE_FILE = re.compile(rf"{EPISODE_DIR}/episode_\d{{6,}}\.safetensors")


class DatasetError(Exception):
    """A dataset file is missing, corrupt or does not match its index; names the file and the problem."""

    def __init__(self, path: str | Path, problem: str):
        super().__init__(str(path), problem)  # both in args, so the error survives pickling between processes
        self.path = Path(path)
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


@dataclass(eq=False)  # tensors have no single truth value; compare episodes field by field
class Episode:
    """One episode of T steps. Observations hold T+1 entries: the first after reset, the last the final one."""

    obs: dict[str, torch.Tensor]  # [T+1, ...] each
    action: torch.Tensor  # [T, A] float32 in [-1, 1], the executed action (the operator's where intervened)
    reward: torch.Tensor  # [T] float32
    terminated: torch.Tensor  # [T] bool
    truncated: torch.Tensor  # [T] bool
    success: torch.Tensor  # [T] bool, task success after each step
    intervention: torch.Tensor  # [T] bool, whether an operator's action replaced the policy's at that step
    metadata: dict[str, str] = field(default_factory=dict)  # e.g. source=teleop|scripted|policy, seed, task

    def __len__(self) -> int:
        return int(self.action.shape[0])

    @property
    def success_any(self) -> bool:
        """Whether the episode reached success at any step."""
        return bool(self.success.any())

    @property
    def num_interventions(self) -> int:
        return int(self.intervention.sum())

    def validate(self, obs_spec: Mapping[str, TensorSpec] | None = None, action_dim: int | None = None) -> None:
        """Raise ValueError naming the field unless shapes, dtypes and values are consistent.

        Checks: action [T, A] float32, finite, within [-1, 1] (T >= 1); reward [T] float32 finite; the flags
        [T] bool, the episode ending (terminated or truncated) at its last step only; every observation
        [T+1, ...] with finite floats, matching `obs_spec` (keys, shapes, dtypes) and `action_dim` when given.
        """
        length = _check_action(self.action, action_dim)
        _check_tensor("reward", self.reward, (length,), torch.float32)
        if not torch.isfinite(self.reward).all():
            raise ValueError(f"reward: non-finite value at step {_first_true(~torch.isfinite(self.reward))}")
        for name in FLAG_TENSORS:
            _check_tensor(name, getattr(self, name), (length,), torch.bool)
        ended_early = (self.terminated | self.truncated)[:-1]
        if ended_early.any():
            raise ValueError(
                f"terminated/truncated: the episode ends at step {_first_true(ended_early)} before its last step "
                f"{length - 1}; cut it there"
            )
        _check_episode_obs(self.obs, length, obs_spec)
        check_metadata("metadata", self.metadata)


def _first_true(mask: torch.Tensor) -> int:
    return int(mask.reshape(-1).nonzero()[0, 0]) if mask.numel() else -1


def _check_tensor(name: str, value: object, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if tuple(value.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(value.shape)}")
    if value.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {value.dtype}")


def _check_action(action: object, action_dim: int | None) -> int:
    """The episode length T, or ValueError: the action must be [T, A] float32, finite, within [-1, 1]."""
    if not isinstance(action, torch.Tensor) or action.dim() != 2:
        shape = list(action.shape) if isinstance(action, torch.Tensor) else type(action).__name__
        raise ValueError(f"action: expected a [T, action_dim] tensor, got {shape}")
    length, dim = action.shape
    if length < 1:
        raise ValueError("action: an episode needs at least one step, got 0")
    if action_dim is not None and dim != action_dim:
        raise ValueError(f"action: expected action_dim {action_dim}, got shape {list(action.shape)}")
    if action.dtype != torch.float32:
        raise ValueError(f"action: expected dtype torch.float32, got {action.dtype}")
    if not torch.isfinite(action).all():
        raise ValueError(f"action: non-finite value at step {_first_true((~torch.isfinite(action)).any(-1))}")
    outside = (action.abs() > 1.0 + ACTION_TOLERANCE).any(-1)
    if outside.any():
        step = _first_true(outside)
        raise ValueError(f"action: outside [-1, 1] at step {step}: {action[step].tolist()}")
    return int(length)


def _check_episode_obs(obs: object, length: int, obs_spec: Mapping[str, TensorSpec] | None) -> None:
    if not isinstance(obs, Mapping) or not obs:
        raise ValueError(f"obs: expected a non-empty dict of tensors, got {type(obs).__name__}")
    if obs_spec is not None and set(obs) != set(obs_spec):
        missing, extra = sorted(set(obs_spec) - set(obs)), sorted(set(obs) - set(obs_spec))
        raise ValueError(f"obs: keys do not match the spec (missing {missing}, unexpected {extra})")
    for key, value in obs.items():
        name = f"obs[{key!r}]"
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ValueError(f"{name}: expected a str key and a torch.Tensor, got {type(value).__name__}")
        if value.dim() == 0 or value.shape[0] != length + 1:
            raise ValueError(f"{name}: expected {length + 1} observations (T+1), got shape {list(value.shape)}")
        if obs_spec is not None:
            spec = obs_spec[key]
            if tuple(value.shape[1:]) != spec.shape:
                raise ValueError(f"{name}: expected shape [T+1]{list(spec.shape)}, got {list(value.shape)}")
            if value.dtype != spec.dtype:
                raise ValueError(f"{name}: expected dtype {spec.dtype}, got {value.dtype}")
        if value.is_floating_point() and not torch.isfinite(value).all():
            bad = (~torch.isfinite(value)).reshape(length + 1, -1).any(-1)
            raise ValueError(f"{name}: non-finite value in observation {_first_true(bad)}")


def check_metadata(name: str, metadata: object) -> dict[str, str]:
    """A copy of `metadata` as dict[str, str], or ValueError naming the bad entry."""
    if not isinstance(metadata, Mapping):
        raise ValueError(f"{name}: expected a dict of str -> str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"{name}[{key!r}]: keys and values must be str, got {type(value).__name__} {value!r}")
    return dict(metadata)


def check_obs_spec(obs_spec: object) -> dict[str, TensorSpec]:
    """A copy of `obs_spec` as dict[str, TensorSpec] with storable dtypes, or ValueError naming the key."""
    if not isinstance(obs_spec, Mapping) or not obs_spec:
        raise ValueError(f"obs_spec: expected a non-empty dict of str -> TensorSpec, got {obs_spec!r}")
    checked = {}
    for key, spec in obs_spec.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"obs_spec: keys must be non-empty str, got {key!r}")
        if not isinstance(spec, TensorSpec):
            raise ValueError(f"obs_spec[{key!r}]: expected a TensorSpec, got {type(spec).__name__}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in spec.shape):
            raise ValueError(f"obs_spec[{key!r}]: shape must be positive ints, got {spec.shape}")
        if spec.dtype not in DTYPES.values():
            raise ValueError(f"obs_spec[{key!r}]: dtype {spec.dtype} cannot be stored; use one of {sorted(DTYPES)}")
        checked[key] = TensorSpec(tuple(spec.shape), spec.dtype)
    return checked


def _check_action_dim(action_dim: object) -> int:
    if isinstance(action_dim, bool) or not isinstance(action_dim, int) or action_dim < 1:
        raise ValueError(f"action_dim: expected an int >= 1, got {action_dim!r}")
    return action_dim


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def obs_spec_to_json(obs_spec: Mapping[str, TensorSpec]) -> dict:
    """The index's form of an obs spec: key -> {shape: [ints], dtype: name}."""
    return {k: {"shape": list(s.shape), "dtype": _dtype_name(s.dtype)} for k, s in obs_spec.items()}


def obs_spec_from_json(raw: object) -> dict[str, TensorSpec]:
    """Inverse of obs_spec_to_json; ValueError naming the bad key."""
    if not isinstance(raw, dict):
        raise ValueError(f"obs_spec: expected an object, got {raw!r}")
    spec = {}
    for key, entry in raw.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list) or entry.get("dtype") not in DTYPES:
            raise ValueError(f"obs_spec[{key!r}]: expected {{shape: [ints], dtype: one of {sorted(DTYPES)}}}")
        spec[key] = TensorSpec(tuple(entry["shape"]), DTYPES[entry["dtype"]])
    return check_obs_spec(spec)


def _spec_mismatch(have: Mapping[str, TensorSpec], want: Mapping[str, TensorSpec]) -> str | None:
    """What differs between two obs specs, naming the first key, or None."""
    if set(have) != set(want):
        return f"obs keys differ: the dataset has {sorted(have)}, asked for {sorted(want)}"
    for key, spec in have.items():
        if spec != want[key]:
            return (
                f"obs_spec[{key!r}] differs: the dataset has shape {list(spec.shape)} {_dtype_name(spec.dtype)}, "
                f"asked for {list(want[key].shape)} {_dtype_name(want[key].dtype)}"
            )
    return None


@dataclass(frozen=True)
class EpisodeEntry:
    """What the index says about one episode, readable without loading it."""

    file: str  # relative to the dataset root
    length: int
    success: bool
    interventions: int  # number of steps an operator's action replaced the policy's
    sha256: str  # of the whole episode file

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "length": self.length,
            "success": self.success,
            "interventions": self.interventions,
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, position: int, raw: object) -> EpisodeEntry:
        def bad(what: str) -> ValueError:
            return ValueError(f"episodes[{position}]: {what}, got {raw!r}")

        if not isinstance(raw, dict):
            raise bad("expected an object")
        file, length, sha = raw.get("file"), raw.get("length"), raw.get("sha256")
        if not isinstance(file, str) or not _EPISODE_FILE.fullmatch(file):
            raise bad(f"file must look like {EPISODE_DIR}/episode_000000.safetensors")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise bad("length must be an int >= 1")
        interventions = raw.get("interventions")
        if isinstance(interventions, bool) or not isinstance(interventions, int) or not 0 <= interventions <= length:
            raise bad("interventions must be an int in [0, length]")
        if not isinstance(raw.get("success"), bool):
            raise bad("success must be true or false")
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise bad("sha256 must be 64 lowercase hex digits")
        return cls(file, length, raw["success"], interventions, sha)


def _episode_bytes(episode: Episode) -> bytes:
    tensors = {f"obs.{k}": v for k, v in episode.obs.items()}
    tensors.update({name: getattr(episode, name) for name in STEP_TENSORS})
    # clone: safetensors refuses tensors that share storage (e.g. views of one recorded batch)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    return safetensors.torch.save(tensors, metadata=dict(episode.metadata))


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The string metadata of a safetensors file: its header is an 8-byte little-endian length, then JSON."""
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    return check_metadata("safetensors metadata", header.get("__metadata__", {}))


class EpisodeDataset:
    """A directory of episodes with an index; make one with `create` or `open`, never directly."""

    def __init__(
        self,
        root: Path,
        obs_spec: dict[str, TensorSpec],
        action_dim: int,
        metadata: dict[str, str],
        entries: list[EpisodeEntry],
    ):
        self.root = root
        self.obs_spec = obs_spec
        self.action_dim = action_dim
        self.metadata = metadata
        self._entries = entries

    # -- creating and opening ------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        root: str | Path,
        obs_spec: Mapping[str, TensorSpec],
        action_dim: int,
        metadata: Mapping[str, str] | None = None,
        exist_ok: bool = False,
    ) -> EpisodeDataset:
        """A new, empty dataset at `root`; with `exist_ok`, the dataset already there, if its spec matches.

        Matching means the same obs keys, shapes and dtypes, the same action_dim, and the stored metadata
        holding every given metadata entry with the same value.
        """
        root = Path(root)
        obs_spec = check_obs_spec(obs_spec)
        action_dim = _check_action_dim(action_dim)
        metadata = check_metadata("metadata", metadata if metadata is not None else {})
        index_path = root / INDEX_FILE
        if index_path.exists():
            if not exist_ok:
                raise DatasetError(index_path, "a dataset already exists here; pass exist_ok=True to append to it")
            dataset = cls.open(root)
            dataset._check_matches(obs_spec, action_dim, metadata)
            return dataset
        if root.exists() and not _is_fresh_directory(root):
            raise DatasetError(
                root,
                "exists and is not an empty directory, and holds no dataset index; choose a new or empty directory",
            )
        (root / EPISODE_DIR).mkdir(parents=True, exist_ok=True)
        dataset = cls(root, obs_spec, action_dim, metadata, [])
        dataset._write_index()
        return dataset

    @classmethod
    def open(cls, root: str | Path) -> EpisodeDataset:
        """The dataset at `root`, after checking its index and that every episode file it names exists."""
        root = Path(root)
        index_path = root / INDEX_FILE
        if not index_path.is_file():
            if not root.exists():
                raise DatasetError(index_path, f"no dataset index: {root} does not exist")
            raise DatasetError(index_path, "no dataset index: not a robotrl episode dataset, or its creation failed")
        try:
            raw = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DatasetError(index_path, f"unreadable index: {err}") from None
        try:
            dataset = cls._from_index(root, raw)
        except ValueError as err:
            raise DatasetError(index_path, f"invalid index: {err}") from None
        for entry in dataset._entries:
            if not (root / entry.file).is_file():
                raise DatasetError(root / entry.file, "episode file named by the index is missing")
        return dataset

    @classmethod
    def _from_index(cls, root: Path, raw: object) -> EpisodeDataset:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise ValueError(f"format must be {FORMAT_NAME!r}")
        version = raw.get("version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"version {version!r} is not supported by this robotrl (it reads version {FORMAT_VERSION})"
            )
        obs_spec = obs_spec_from_json(raw.get("obs_spec"))
        action_dim = _check_action_dim(raw.get("action_dim"))
        metadata = check_metadata("metadata", raw.get("metadata"))
        episodes = raw.get("episodes")
        if not isinstance(episodes, list):
            raise ValueError(f"episodes: expected a list, got {episodes!r}")
        entries = [EpisodeEntry.from_json(i, e) for i, e in enumerate(episodes)]
        if len({e.file for e in entries}) != len(entries):
            raise ValueError("episodes: two entries name the same file")
        return cls(root, obs_spec, action_dim, metadata, entries)

    def _check_matches(self, obs_spec: dict[str, TensorSpec], action_dim: int, metadata: dict[str, str]) -> None:
        index_path = self.root / INDEX_FILE
        mismatch = _spec_mismatch(self.obs_spec, obs_spec)
        if mismatch:
            raise DatasetError(index_path, mismatch)
        if action_dim != self.action_dim:
            raise DatasetError(index_path, f"action_dim differs: the dataset has {self.action_dim}, asked {action_dim}")
        for key, value in metadata.items():
            if self.metadata.get(key) != value:
                raise DatasetError(
                    index_path,
                    f"metadata[{key!r}] differs: the dataset has {self.metadata.get(key)!r}, asked {value!r}",
                )

    def _write_index(self) -> None:
        index = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "obs_spec": obs_spec_to_json(self.obs_spec),
            "action_dim": self.action_dim,
            "metadata": self.metadata,
            "episodes": [e.to_json() for e in self._entries],
        }
        write_atomic(self.root / INDEX_FILE, json.dumps(index, indent=1).encode("utf-8"))

    # -- reading and writing episodes ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_steps(self) -> int:
        return sum(e.length for e in self._entries)

    @property
    def entries(self) -> tuple[EpisodeEntry, ...]:
        """The index's record of each episode (length, success, interventions), without loading any."""
        return tuple(self._entries)

    def append(self, episode: Episode) -> Path:
        """Validate `episode` against the spec, write its file, then the index; returns the file's path."""
        if not isinstance(episode, Episode):
            raise TypeError(f"{self.root}: append takes an Episode, got {type(episode).__name__}")
        try:
            episode.validate(self.obs_spec, self.action_dim)
        except ValueError as err:
            raise ValueError(f"{self.root}: episode does not fit this dataset: {err}") from None
        file = f"{EPISODE_DIR}/episode_{self._next_file_number():06d}.safetensors"
        data = _episode_bytes(episode)
        path = self.root / file
        write_atomic(path, data)
        entry = EpisodeEntry(file, len(episode), episode.success_any, episode.num_interventions, sha256_of_bytes(data))
        self._entries.append(entry)
        try:
            self._write_index()
        except BaseException:
            self._entries.pop()  # the index on disk still names the previous episodes only
            raise
        return path

    def _next_file_number(self) -> int:
        """One past every episode file's number, listed or on disk: the count of entries would reuse the name of
        a listed file once an entry was removed from the index, or of a file whose index write failed."""
        names = [e.file for e in self._entries] + [p.name for p in (self.root / EPISODE_DIR).glob("episode_*")]
        numbers = [int(m.group(1)) for n in names if (m := re.search(r"episode_(\d+)\.safetensors$", n))]
        return max(numbers, default=-1) + 1

    def load(self, index: int) -> Episode:
        """Episode `index` (negative counts from the end), after checking its file's checksum and contents."""
        if isinstance(index, bool) or not isinstance(index, int) or not -len(self) <= index < len(self):
            raise IndexError(f"{self.root}: episode index {index!r} out of range for {len(self)} episodes")
        return self._read(self._entries[index])

    def load_all(self) -> list[Episode]:
        """Every episode, in order; raises DatasetError naming the bad files if any fails its checks."""
        episodes, errors = [], []
        for entry in self._entries:
            try:
                episodes.append(self._read(entry))
            except DatasetError as err:
                errors.append(err)
        if errors:
            others = "".join(f"; also {e}" for e in errors[1:])
            raise DatasetError(errors[0].path, f"{errors[0].problem} ({len(errors)} bad episode files){others}")
        return episodes

    def __iter__(self) -> Iterator[Episode]:
        for position in range(len(self)):
            yield self.load(position)

    def _read(self, entry: EpisodeEntry) -> Episode:
        path = self.root / entry.file
        try:
            data = path.read_bytes()
        except OSError as err:
            raise DatasetError(path, f"cannot read episode file: {err.strerror}") from None
        digest = sha256_of_bytes(data)
        if digest != entry.sha256:
            raise DatasetError(path, mismatch_problem(digest, entry.sha256, "index"))
        try:
            tensors = safetensors.torch.load(data)
            metadata = _safetensors_metadata(data)
        except Exception as err:  # safetensors and json raise several types for a malformed file
            raise DatasetError(path, f"not a readable safetensors episode: {err}") from None
        expected = {f"obs.{k}" for k in self.obs_spec} | set(STEP_TENSORS)
        missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        if missing:
            raise DatasetError(
                path, f"missing tensor {missing[0]!r}" + (f" (and {missing[1:]})" if missing[1:] else "")
            )
        if unexpected:
            raise DatasetError(path, f"unexpected tensor {unexpected[0]!r}")
        episode = Episode(
            obs={k: tensors[f"obs.{k}"] for k in self.obs_spec},
            **{name: tensors[name] for name in STEP_TENSORS},
            metadata=metadata,
        )
        try:
            episode.validate(self.obs_spec, self.action_dim)
        except ValueError as err:
            raise DatasetError(path, f"invalid contents: {err}") from None
        if len(episode) != entry.length:
            raise DatasetError(path, f"holds {len(episode)} steps, the index says {entry.length}")
        if episode.success_any != entry.success or episode.num_interventions != entry.interventions:
            raise DatasetError(
                path,
                f"success {episode.success_any} and {episode.num_interventions} interventions, the index says "
                f"{entry.success} and {entry.interventions}",
            )
        return episode


def _is_fresh_directory(root: Path) -> bool:
    """Whether `root` is an empty directory, or holds only the empty episodes/ of a create that did not finish."""
    if not root.is_dir():
        return False
    contents = list(root.iterdir())
    episodes = root / EPISODE_DIR
    return not contents or (contents == [episodes] and episodes.is_dir() and not any(episodes.iterdir()))


class _EpisodeInProgress:
    """The steps one env has taken since its episode started; per-env rows are views into batched copies."""

    def __init__(self, first_obs: dict[str, torch.Tensor]):
        self.obs = {k: [v] for k, v in first_obs.items()}
        self.steps: dict[str, list[torch.Tensor]] = {name: [] for name in STEP_TENSORS}

    def add(self, next_obs: dict[str, torch.Tensor], step: dict[str, torch.Tensor]) -> None:
        for key, value in next_obs.items():
            self.obs[key].append(value)
        for name, value in step.items():
            self.steps[name].append(value)

    def finish(self, metadata: dict[str, str]) -> Episode:
        obs = {k: torch.stack(v) for k, v in self.obs.items()}
        return Episode(obs=obs, **{k: torch.stack(v) for k, v in self.steps.items()}, metadata=dict(metadata))


class EpisodeRecorder:
    """Cuts batched env steps (num_envs envs) into per-env Episodes.

    Call `start` with the observations after `env.reset`, then `step` after every `env.step`; `step`
    returns the episodes that ended there and starts those envs' next episodes from the reset observation.
    """

    def __init__(self, num_envs: int, metadata: Mapping[str, str] | None = None):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: expected an int >= 1, got {num_envs!r}")
        self.num_envs = num_envs
        self.metadata = check_metadata("metadata", metadata if metadata is not None else {})
        self._keys: tuple[str, ...] = ()
        self._obs_shapes: dict[str, tuple[int, ...]] = {}  # [num_envs, ...] of each key, fixed by start
        self._action_dim: int | None = None
        self._episodes: list[_EpisodeInProgress] | None = None

    def start(self, obs: Mapping[str, torch.Tensor]) -> None:
        """Begin an episode in every env from `obs` ([num_envs, ...] each); drops any episode in progress."""
        if not isinstance(obs, Mapping) or not obs:
            raise ValueError(f"obs: expected a non-empty dict of [{self.num_envs}, ...] tensors, got {obs!r}")
        self._keys = tuple(obs)
        self._obs_shapes = {}
        batch = self._batch_obs("obs", obs)
        self._obs_shapes = {k: tuple(v.shape) for k, v in batch.items()}
        self._action_dim = None
        self._episodes = [_EpisodeInProgress({k: v[e] for k, v in batch.items()}) for e in range(self.num_envs)]

    def step(self, action: torch.Tensor, result: StepResult) -> list[Episode]:
        """Record one env step; returns the episodes that ended at it, in env order.

        `action` is the policy's [num_envs, A] action; where `result.action` is set (an intervention
        wrapper), that executed action is recorded instead, and `result.intervened` marks the steps an
        operator took over.
        """
        if self._episodes is None:
            raise RuntimeError("EpisodeRecorder.step called before start(obs)")
        executed = self._batch_action(action if result.action is None else result.action)
        num = self.num_envs
        step = {
            "action": executed,
            "reward": self._batch("result.reward", result.reward, (num,), float_out=True),
            "terminated": self._batch("result.terminated", result.terminated, (num,), flags=True),
            "truncated": self._batch("result.truncated", result.truncated, (num,), flags=True),
            "success": self._batch("result.success", result.success, (num,), flags=True),
            "intervention": torch.zeros(num, dtype=torch.bool)
            if result.intervened is None
            else self._batch("result.intervened", result.intervened, (num,), flags=True),
        }
        if not torch.isfinite(step["reward"]).all():
            raise ValueError(f"result.reward: non-finite value {step['reward'].tolist()}")
        next_obs = self._batch_obs("result.next_obs", result.next_obs)
        ended = step["terminated"] | step["truncated"]
        reset_obs = self._batch_obs("result.obs", result.obs) if ended.any() else None
        finished = []
        for env in range(num):
            self._episodes[env].add({k: v[env] for k, v in next_obs.items()}, {k: v[env] for k, v in step.items()})
            if ended[env]:
                finished.append(self._episodes[env].finish(self.metadata))
                self._episodes[env] = _EpisodeInProgress({k: v[env] for k, v in reset_obs.items()})
        return finished

    def _batch(
        self, name: str, value: object, shape: tuple[int, ...], flags: bool = False, float_out: bool = False
    ) -> torch.Tensor:
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"{name}: expected shape {list(shape)}, got {got}")
        if flags and value.dtype != torch.bool:
            raise ValueError(f"{name}: expected dtype torch.bool, got {value.dtype}")
        value = value.detach().to("cpu", torch.float32 if float_out else value.dtype)
        return value.clone()  # the env may reuse its buffers; rows of this copy are kept until episodes end

    def _batch_action(self, action: object) -> torch.Tensor:
        if not isinstance(action, torch.Tensor) or action.dim() != 2 or action.shape[0] != self.num_envs:
            got = list(action.shape) if isinstance(action, torch.Tensor) else type(action).__name__
            raise ValueError(f"action: expected shape [{self.num_envs}, action_dim], got {got}")
        if self._action_dim is not None and action.shape[1] != self._action_dim:
            raise ValueError(f"action: expected action_dim {self._action_dim} as before, got {list(action.shape)}")
        action = self._batch("action", action, tuple(action.shape), float_out=True)
        if not torch.isfinite(action).all() or (action.abs() > 1.0 + ACTION_TOLERANCE).any():
            raise ValueError(f"action: expected finite values in [-1, 1], got {action.tolist()}")
        self._action_dim = int(action.shape[1])
        return action

    def _batch_obs(self, name: str, obs: object) -> dict[str, torch.Tensor]:
        if not isinstance(obs, Mapping) or set(obs) != set(self._keys):
            keys = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
            raise ValueError(f"{name}: expected keys {sorted(self._keys)}, got {keys}")
        batch = {}
        for key in self._keys:
            value = obs[key]
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != self.num_envs:
                got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{name}[{key!r}]: expected a [{self.num_envs}, ...] tensor, got {got}")
            if self._obs_shapes and tuple(value.shape) != self._obs_shapes[key]:
                expected = list(self._obs_shapes[key])
                raise ValueError(f"{name}[{key!r}]: expected shape {expected} as at start, got {list(value.shape)}")
            batch[key] = self._batch(f"{name}[{key!r}]", value, tuple(value.shape))
        return batch
