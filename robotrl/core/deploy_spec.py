"""What a robot needs to run a policy, as one typed, validated record: the deploy spec.

A task produces it (robotrl/tasks: `ArmTask.deploy_spec`, `robotrl.tasks.deploy_spec_for`); robotrl-train and
robotrl-learner write it into the run directory as `deploy_spec.json` when a run starts; robotrl-deploy and
robotrl-actor on a robot read it (hardware/deployment.py) and build nothing simulated from it. It holds the
controller (kind, step sizes, relative frame, gripper use), the episode length and control rate, the cameras,
the frame stack, every observation entry with its shape, dtype and where a robot gets it (`ObsEntry.source`),
the action bounds, what the task's score reads, held-point offsets, start regions and the goals drawn per
episode. Functions (the task's score, its goal draw) are not data: the spec names the task, and the robot
side takes them from the task's module (`robotrl.tasks.task_functions`), which imports no simulator.

The JSON file carries `format_version`; a file from a newer robotrl, or one that is not a whole valid spec
(bad JSON, a key missing or unknown, a value of the wrong type), is refused naming the file and the entry.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from robotrl.core.durable import write_atomic
from robotrl.core.spec import TensorSpec

FORMAT_VERSION = 1
FILE_NAME = "deploy_spec.json"
CONTROLS = ("ee_delta", "joint_delta", "joint_position")
DTYPES = {"float32": torch.float32, "uint8": torch.uint8}

# Where a robot gets an observation entry, and the fields each source needs:
#   joint_state      the joint state topic; `of`: position | velocity | gripper (opening, 1 = open)
#   kinematics       forward kinematics of the joint state; `of`: tool_point | fingertips (a hand's, relative to its
#                    palm: the robot spec's fingertip_sites minus its palm_site, concatenated)
#   object           a tracked object's pose; `of`: the object, `part`: pos | quat | from_ee (object - tool
#                    point) | from_palm (object - a hand's palm site) | to_goal (`goal` minus the object's position,
#                    in the goal's dimensions) | quat_to_goal (the rotation still to make: the `goal` quaternion
#                    times the conjugate of the object's)
#   goal             a goal: drawn per episode when it is in `drawn_goals`, else given by the person deploying
#   goal_minus_tool  `goal` minus the tool point
#   held_point       a point fixed to the tool (`of`, offset in `held`), by forward kinematics
#   goal_minus_held  `goal` minus the held point `of`
#   camera           `of`'s frames, [3 * frame_stack, image_size, image_size] uint8
#   simulation       state only a simulator has: no robot gives it, so a policy reading it cannot run on one
SOURCES = (
    "joint_state",
    "kinematics",
    "object",
    "goal",
    "goal_minus_tool",
    "held_point",
    "goal_minus_held",
    "camera",
    "simulation",
)
JOINT_STATE = ("position", "velocity", "gripper")
OBJECT_PARTS = ("pos", "quat", "from_ee", "from_palm", "to_goal", "quat_to_goal")
GOAL_PARTS = ("to_goal", "quat_to_goal")  # the object parts measured against a goal
KINEMATIC_POINTS = ("tool_point", "fingertips")
_NEEDS = {  # source -> (fields that must be set, fields that must not be)
    "joint_state": ({"of"}, {"part", "goal"}),
    "kinematics": ({"of"}, {"part", "goal"}),
    "object": ({"of", "part"}, set()),
    "goal": (set(), {"of", "part", "goal"}),
    "goal_minus_tool": ({"goal"}, {"of", "part"}),
    "held_point": ({"of"}, {"part", "goal"}),
    "goal_minus_held": ({"of", "goal"}, {"part"}),
    "camera": ({"of"}, {"part", "goal"}),
    "simulation": (set(), {"of", "part", "goal"}),
}


class DeploySpecError(ValueError):
    """A deploy spec that is not valid, or a file that holds none; the message names the file and the entry."""


@dataclass(frozen=True)
class ObsEntry:
    """One observation entry: its shape and dtype (no batch dimension) and where a robot gets it (SOURCES)."""

    shape: tuple[int, ...]
    source: str
    dtype: str = "float32"
    of: str | None = None  # the joint state quantity, kinematic point, object, held point or camera
    part: str | None = None  # object: OBJECT_PARTS
    goal: str | None = None  # goal_minus_tool, goal_minus_held, object GOAL_PARTS: the goal it is measured against

    def tensor_spec(self) -> TensorSpec:
        return TensorSpec(tuple(self.shape), DTYPES[self.dtype])

    def validate(self, key: str) -> None:
        where = f"observations.{key}"
        if not (isinstance(self.shape, tuple) and self.shape and all(_is_int(n) and n >= 1 for n in self.shape)):
            raise DeploySpecError(f"{where}.shape must be a non-empty list of integers >= 1, got {self.shape!r}")
        if self.dtype not in DTYPES:
            raise DeploySpecError(f"{where}.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.source not in SOURCES:
            raise DeploySpecError(f"{where}.source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        needed, unused = _NEEDS[self.source]
        for name in ("of", "part", "goal"):
            value = getattr(self, name)
            if name in needed and not (isinstance(value, str) and value.isidentifier()):
                raise DeploySpecError(f"{where}.{name} must name one (an identifier) for source {self.source}")
            if name in unused and value is not None:
                raise DeploySpecError(f"{where}.{name} is not used by source {self.source}; got {value!r}")
        if self.source == "joint_state" and self.of not in JOINT_STATE:
            raise DeploySpecError(f"{where}.of must be one of {', '.join(JOINT_STATE)}, got {self.of!r}")
        if self.source == "object":
            if self.part not in OBJECT_PARTS:
                raise DeploySpecError(f"{where}.part must be one of {', '.join(OBJECT_PARTS)}, got {self.part!r}")
            if (self.part in GOAL_PARTS) != (self.goal is not None):
                raise DeploySpecError(f"{where}.goal names the goal of parts {', '.join(GOAL_PARTS)}, and only of them")
            if self.part == "quat_to_goal" and self.shape != (4,):
                raise DeploySpecError(f"{where}: a rotation to a goal is a quaternion [4], got {list(self.shape)}")
        if self.source == "kinematics" and self.of not in KINEMATIC_POINTS:
            raise DeploySpecError(f"{where}.of must be one of {', '.join(KINEMATIC_POINTS)}, got {self.of!r}")
        if (self.source == "camera") != (self.dtype == "uint8"):
            raise DeploySpecError(f"{where}: camera entries are uint8 and only they are, got {self.dtype}")
        if self.source in ("goal_minus_tool", "held_point", "goal_minus_held") and self.shape != (3,):
            raise DeploySpecError(f"{where}: a point relative to the tool has shape [3], got {list(self.shape)}")


@dataclass(frozen=True)
class DeploySpec:
    """See the module docstring. `task_config` is the task's settings (its config's plain values): the task's
    score reads some of them (reward variant, success threshold)."""

    task: str  # the registered task name (robotrl.tasks.SIM_TASKS)
    task_config: dict[str, Any]
    robot: str  # robotrl/core/robots/<robot>.yaml
    control: str  # ee_delta | joint_delta | joint_position
    max_ee_step: float  # metres per step at |action| = 1 (ee_delta)
    max_joint_step: float  # radians per step at |action| = 1 (joint_delta)
    relative_frame: bool  # ee_delta motions in the tool's frame at the episode's start
    gripper_action: bool  # the last action entry moves the gripper
    gripper_hold: float | None  # where a policy that never moves the gripper keeps it (metres per finger)
    episode_steps: int
    policy_rate_hz: float | None  # the rate the task's policy acted at in training; None: the task has none
    cameras: tuple[str, ...]
    image_size: int | None  # square frames; None without cameras
    frame_stack: int  # camera frames per observation, oldest first
    observations: dict[str, ObsEntry]
    action_dim: int
    action_low: tuple[float, ...]  # the policy's action bounds (agents act in [-1, 1])
    action_high: tuple[float, ...]
    score_reads: tuple[str, ...]  # the entries the task's score reads; (): it needs more (contacts)
    held: dict[str, tuple[float, ...]]  # held point -> its offset in the tool point's frame (metres)
    start_regions: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]  # object -> (low, high) of its start
    drawn_goals: tuple[str, ...]  # goals the task draws per episode (score_from_obs's module: draw_episode_goals)
    format_version: int = field(default=FORMAT_VERSION)

    # -- views --------------------------------------------------------------------------------------
    def obs_spec(self) -> dict[str, TensorSpec]:
        """The policy's observation spec, as the simulated env gave it in training."""
        return {key: entry.tensor_spec() for key, entry in self.observations.items()}

    @property
    def scores_from_observations(self) -> bool:
        """Whether the task's score can run on what this policy observes (not a pixel-only policy)."""
        return bool(self.score_reads) and set(self.score_reads) <= set(self.observations)

    def entries(self, *sources: str) -> dict[str, ObsEntry]:
        return {key: entry for key, entry in self.observations.items() if entry.source in sources}

    def goal_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every goal the observation reads (an entry of its own, or one an entry is measured against)."""
        goals = {key: entry.shape for key, entry in self.entries("goal").items()}
        for entry in self.observations.values():
            if entry.goal is not None:
                goals.setdefault(entry.goal, entry.shape)
        return goals

    def tracked_objects(self) -> list[str]:
        return sorted({entry.of for entry in self.entries("object").values()})

    # -- checks -------------------------------------------------------------------------------------
    def validate(self) -> None:
        """DeploySpecError naming the first entry that is wrong."""
        if not (_is_int(self.format_version) and 1 <= self.format_version <= FORMAT_VERSION):
            raise DeploySpecError(f"format_version must be 1..{FORMAT_VERSION}, got {self.format_version!r}")
        for name in ("task", "robot"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise DeploySpecError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.control not in CONTROLS:
            raise DeploySpecError(f"control must be one of {', '.join(CONTROLS)}, got {self.control!r}")
        for name in ("max_ee_step", "max_joint_step"):
            if not (_is_number(getattr(self, name)) and getattr(self, name) > 0):
                raise DeploySpecError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        if self.relative_frame and self.control != "ee_delta":
            raise DeploySpecError(f"relative_frame=true rotates ee_delta actions; control is {self.control}")
        if self.gripper_hold is not None and (self.gripper_action or not _is_number(self.gripper_hold)):
            raise DeploySpecError(
                f"gripper_hold is a finite opening for a policy that never moves the gripper, got {self.gripper_hold!r}"
            )
        for name in ("episode_steps", "frame_stack", "action_dim"):
            if not (_is_int(getattr(self, name)) and getattr(self, name) >= 1):
                raise DeploySpecError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.policy_rate_hz is not None and not (_is_number(self.policy_rate_hz) and self.policy_rate_hz > 0):
            raise DeploySpecError(f"policy_rate_hz must be a number > 0 or null, got {self.policy_rate_hz!r}")
        if len(self.action_low) != self.action_dim or len(self.action_high) != self.action_dim:
            raise DeploySpecError(f"action_low and action_high must have action_dim ({self.action_dim}) values each")
        bounds = zip(self.action_low, self.action_high, strict=True)
        if not all(_is_number(lo) and _is_number(hi) and lo < hi for lo, hi in bounds):
            raise DeploySpecError(f"action bounds must be finite, low < high: {self.action_low}..{self.action_high}")
        if not self.observations:
            raise DeploySpecError("observations must name at least one entry")
        for key, entry in self.observations.items():
            if not (isinstance(key, str) and key):
                raise DeploySpecError(f"observations: entry names must be non-empty strings, got {key!r}")
            entry.validate(key)
        self._check_cameras()
        self._check_goals_and_points()
        for name, offset in self.held.items():
            if not (len(offset) == 3 and all(_is_number(v) for v in offset)):
                raise DeploySpecError(f"held.{name} must be 3 finite offsets (metres, tool frame), got {offset!r}")
        for name, box in self.start_regions.items():
            low, high = box
            if not (1 <= len(low) == len(high) <= 3 and all(_is_number(v) for v in (*low, *high))):
                raise DeploySpecError(f"start_regions.{name} must be [[low...], [high...]] of 1-3 finite values")
            if not all(lo <= hi for lo, hi in zip(low, high, strict=True)):
                raise DeploySpecError(f"start_regions.{name} must have low <= high, got {[low, high]}")
        for key in self.drawn_goals:
            entry = self.observations.get(key)
            if entry is not None and entry.source != "goal":
                raise DeploySpecError(f"drawn_goals names {key!r}, whose observation's source is {entry.source}")

    def _check_cameras(self) -> None:
        cameras = {entry.of: key for key, entry in self.entries("camera").items()}
        if sorted(cameras) != sorted(self.cameras) or len(set(self.cameras)) != len(self.cameras):
            raise DeploySpecError(f"cameras {list(self.cameras)} must be those of the camera entries {sorted(cameras)}")
        if self.cameras and not (_is_int(self.image_size) and self.image_size >= 1):
            raise DeploySpecError(f"image_size must be an integer >= 1 with cameras, got {self.image_size!r}")
        for camera, key in cameras.items():
            want = (3 * self.frame_stack, self.image_size, self.image_size)
            if self.observations[key].shape != want:
                raise DeploySpecError(
                    f"observations.{key}: camera {camera!r} gives {list(want)} (frame_stack, image_size), "
                    f"got {list(self.observations[key].shape)}"
                )

    def _check_goals_and_points(self) -> None:
        goals = {key: entry.shape for key, entry in self.entries("goal").items()}
        for key, entry in self.observations.items():
            if entry.source in ("held_point", "goal_minus_held") and entry.of not in self.held:
                raise DeploySpecError(f"observations.{key}: held point {entry.of!r} has no offset in held")
            if entry.goal is None:
                continue
            shape = goals.setdefault(entry.goal, entry.shape)
            needs_three = entry.source in ("goal_minus_tool", "goal_minus_held")
            if (needs_three and shape != (3,)) or (entry.source == "object" and shape != entry.shape):
                raise DeploySpecError(
                    f"observations.{key}: goal {entry.goal!r} has shape {list(shape)}, which {entry.source} "
                    f"{'needs as [3]' if needs_three else f'gives as {list(entry.shape)}'}"
                )

    # -- JSON ---------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = {"format_version": self.format_version, **asdict(self)}
        data["observations"] = {
            key: {k: v for k, v in asdict(entry).items() if v is not None} for key, entry in self.observations.items()
        }
        return _lists(data)

    @classmethod
    def from_json(cls, data: Any) -> DeploySpec:
        """The spec a `to_json` dict holds; DeploySpecError naming the key that is missing, unknown or of the
        wrong type, or the newer format it is in."""
        if not isinstance(data, dict):
            raise DeploySpecError(f"a deploy spec is a JSON object, got {type(data).__name__}")
        version = data.get("format_version")
        if not _is_int(version):
            raise DeploySpecError(f"format_version must be an integer, got {version!r}")
        if version > FORMAT_VERSION:
            raise DeploySpecError(
                f"format_version {version} is newer than this robotrl reads ({FORMAT_VERSION}): update robotrl"
            )
        _keys(data, {f.name for f in fields(cls)}, "")
        observations = _typed(data["observations"], dict, "observations")
        entries = {}
        for key, raw in observations.items():
            raw = _typed(raw, dict, f"observations.{key}")
            _keys(raw, {"shape", "source"}, f"observations.{key}.", optional={"dtype", "of", "part", "goal"})
            entries[key] = ObsEntry(
                shape=tuple(_typed(raw["shape"], list, f"observations.{key}.shape")),
                source=_typed(raw["source"], str, f"observations.{key}.source"),
                dtype=_typed(raw.get("dtype", "float32"), str, f"observations.{key}.dtype"),
                **{k: _typed(raw[k], str, f"observations.{key}.{k}") for k in ("of", "part", "goal") if k in raw},
            )
        held = _typed(data["held"], dict, "held")
        regions = _typed(data["start_regions"], dict, "start_regions")
        spec = cls(
            task=_typed(data["task"], str, "task"),
            task_config=_typed(data["task_config"], dict, "task_config"),
            robot=_typed(data["robot"], str, "robot"),
            control=_typed(data["control"], str, "control"),
            max_ee_step=_typed(data["max_ee_step"], float, "max_ee_step"),
            max_joint_step=_typed(data["max_joint_step"], float, "max_joint_step"),
            relative_frame=_typed(data["relative_frame"], bool, "relative_frame"),
            gripper_action=_typed(data["gripper_action"], bool, "gripper_action"),
            gripper_hold=_typed(data["gripper_hold"], float, "gripper_hold", optional=True),
            episode_steps=_typed(data["episode_steps"], int, "episode_steps"),
            policy_rate_hz=_typed(data["policy_rate_hz"], float, "policy_rate_hz", optional=True),
            cameras=tuple(_strings(data["cameras"], "cameras")),
            image_size=_typed(data["image_size"], int, "image_size", optional=True),
            frame_stack=_typed(data["frame_stack"], int, "frame_stack"),
            observations=entries,
            action_dim=_typed(data["action_dim"], int, "action_dim"),
            action_low=tuple(_numbers(data["action_low"], "action_low")),
            action_high=tuple(_numbers(data["action_high"], "action_high")),
            score_reads=tuple(_strings(data["score_reads"], "score_reads")),
            held={name: tuple(_numbers(v, f"held.{name}")) for name, v in held.items()},
            start_regions={name: _box(box, f"start_regions.{name}") for name, box in regions.items()},
            drawn_goals=tuple(_strings(data["drawn_goals"], "drawn_goals")),
            format_version=version,
        )
        spec.validate()
        return spec


def spec_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILE_NAME


def write_deploy_spec(spec: DeploySpec, run_dir: str | Path) -> Path:
    """Validate `spec` and write it to `run_dir/deploy_spec.json` atomically (whole or not at all)."""
    spec.validate()
    path = spec_path(run_dir)
    write_atomic(path, (json.dumps(spec.to_json(), indent=2) + "\n").encode("utf-8"))
    return path


def read_deploy_spec(path: str | Path) -> DeploySpec:
    """The spec in `path` (a deploy_spec.json, or a run directory holding one); DeploySpecError naming the file
    and what is wrong with it, FileNotFoundError when there is none."""
    path = Path(path)
    if path.is_dir():
        path = spec_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no deploy spec (robotrl-train and robotrl-learner write one)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DeploySpecError(f"{path}: cannot be read: {error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise DeploySpecError(f"{path}: not valid JSON: {error}") from None
    try:
        return DeploySpec.from_json(data)
    except DeploySpecError as error:
        raise DeploySpecError(f"{path}: {error}") from None


# -- helpers ----------------------------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _keys(data: dict, required: set[str], where: str, optional: frozenset | set = frozenset()) -> None:
    missing = sorted(required - set(data))
    if missing:
        raise DeploySpecError(f"missing {', '.join(where + k for k in missing)}")
    unknown = sorted(set(data) - required - set(optional))
    if unknown:
        raise DeploySpecError(f"unknown {', '.join(where + k for k in unknown)}")


def _typed(value: Any, kind: type, where: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if kind is float and _is_int(value):
        return float(value)
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        wanted = {
            float: "a number",
            int: "an integer",
            bool: "true or false",
            str: "a string",
            dict: "a JSON object",
            list: "a JSON list",
        }[kind]
        raise DeploySpecError(f"{where} must be {wanted}{' or null' if optional else ''}, got {value!r}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    return [_typed(v, str, f"{where}[{i}]") for i, v in enumerate(_typed(value, list, where))]


def _numbers(value: Any, where: str) -> list[float]:
    return [_typed(v, float, f"{where}[{i}]") for i, v in enumerate(_typed(value, list, where))]


def _box(value: Any, where: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    corners = _typed(value, list, where)
    if len(corners) != 2:
        raise DeploySpecError(f"{where} must be [[low...], [high...]], got {value!r}")
    return tuple(_numbers(corners[0], f"{where}[0]")), tuple(_numbers(corners[1], f"{where}[1]"))


def _lists(value: Any) -> Any:
    """Tuples as lists, all the way down (JSON's shape of the data)."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value
