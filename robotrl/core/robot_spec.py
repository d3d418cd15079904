"""Robot specs: joint limits, home pose and end effector, read by the simulated tasks and the shield."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import yaml

ROBOTS_DIR = Path(__file__).resolve().parent / "robots"


@dataclass(frozen=True)
class GripperSpec:
    joints: tuple[str, ...]
    open: float
    closed: float
    max_force: float


@dataclass(frozen=True)
class RobotSpec:
    name: str
    joints: tuple[str, ...]  # the joints a controller commands, in order; actuator act<i> drives the i-th
    position_lower: torch.Tensor
    position_upper: torch.Tensor
    velocity_limit: torch.Tensor
    acceleration_limit: torch.Tensor
    jerk_limit: torch.Tensor
    effort_limit: torch.Tensor
    home: torch.Tensor
    end_effector_site: str | None  # None: no tool point (a hand on a fixed wrist)
    gripper: GripperSpec | None
    # A hand's palm and fingertips (MJCF sites): the points its tasks observe, fingertips and objects relative to the
    # palm, which a robot env computes by forward kinematics as the simulated task reads them from the scene
    palm_site: str | None = None
    fingertip_sites: tuple[str, ...] = ()

    def to(self, device: torch.device | str) -> RobotSpec:
        """This spec with its limit and pose vectors on `device` (a task computes beside its simulator's state)."""
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.type == "torch.Tensor"}
        return replace(self, **moved)


def available_robots() -> list[str]:
    return sorted(p.stem for p in ROBOTS_DIR.glob("*.yaml"))


def load_robot_spec(name: str) -> RobotSpec:
    path = ROBOTS_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"unknown robot {name!r}; available robots: {', '.join(available_robots())}")
    return read_robot_spec(path)


def read_robot_spec(path: Path) -> RobotSpec:
    """The spec in the YAML file `path`; a missing, non-finite or inconsistent limit fails naming it."""
    raw = yaml.safe_load(Path(path).read_text())
    n = len(raw["joints"])
    vectors = {}
    for key in (
        "position_lower",
        "position_upper",
        "velocity_limit",
        "acceleration_limit",
        "jerk_limit",
        "effort_limit",
        "home",
    ):
        values = raw[key]
        if len(values) != n:
            raise ValueError(f"{path}: {key} has {len(values)} values for {n} joints")
        vectors[key] = torch.tensor(values, dtype=torch.float32)
    for key, values in vectors.items():
        if not bool(torch.isfinite(values).all()):
            raise ValueError(f"{path}: {key} must be finite, got {values.tolist()}")
    for key in ("velocity_limit", "acceleration_limit", "jerk_limit", "effort_limit"):
        bad = (vectors[key] <= 0).nonzero().flatten().tolist()
        if bad:
            joint = raw["joints"][bad[0]]
            raise ValueError(
                f"{path}: {key} must be > 0 for every joint, got {vectors[key][bad[0]].item()} for {joint}"
            )
    if not torch.all(vectors["position_lower"] < vectors["position_upper"]):
        raise ValueError(f"{path}: position_lower must be below position_upper for every joint")
    home = vectors["home"]
    if not torch.all((home >= vectors["position_lower"]) & (home <= vectors["position_upper"])):
        raise ValueError(f"{path}: home pose {home.tolist()} lies outside the joint limits")
    gripper = raw.get("gripper")
    return RobotSpec(
        name=raw["name"],
        joints=tuple(raw["joints"]),
        end_effector_site=raw.get("end_effector_site"),
        palm_site=raw.get("palm_site"),
        fingertip_sites=tuple(raw.get("fingertip_sites", ())),
        gripper=GripperSpec(tuple(gripper["joints"]), gripper["open"], gripper["closed"], gripper["max_force"])
        if gripper
        else None,
        **vectors,
    )
