"""A model overlay: the joint dynamics and command latency identified on a robot (`robotrl-sysid`), as a YAML file
that the simulated tasks (`task.model_overlay=<file>`), the twin (`robotrl-sim-twin overlay=<file>`) and the
randomization ranges centre on.

    robot: panda
    parameters:                # absolute values, named as the fit names them
      joint2.armature: 0.148   # kg m^2
      joint2.damping: 2.1      # N m s / rad
      joint7.frictionloss: 0.41  # N m
      act2.kp: 1604.0          # N m / rad: a position actuator's stiffness
      command_latency: 0.0171  # s: a command takes effect this long after it is sent
    half_width_95: {joint2.armature: 0.004, ...}  # the fit's 95% intervals, for the record
    not_identified: [joint1.damping]              # the data could not pin these down alone

A parameter is written as a value when the data constrains it, alone or jointly with the others (its interval
is finite); those it does not pin down alone (a wide interval) are also listed under `not_identified`, and one
the data could not show at all is listed there and absent from `parameters`: it stays at the model's nominal
value. Randomization terms that scale or add (`randomization=default`) then draw around the identified
value, since they read their nominal from the scene after the overlay is applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

JOINT_KINDS = ("armature", "damping", "frictionloss")
LATENCY = "command_latency"
MAX_LATENCY_S = 1.0  # a command later than this is a broken link, not a dynamic to model
# the backend's physics parameter (tasks/backend.py PHYSICS_PARAMS) of each kind
PHYSICS_PARAM = {
    "armature": "joint_armature",
    "damping": "joint_damping",
    "frictionloss": "joint_frictionloss",
    "kp": "actuator_gain",
}


def split_name(name: str) -> tuple[str, str]:
    """(kind, target) of a parameter name: "joint2.armature" -> ("armature", "joint2"), "act2.kp" -> ("kp",
    "act2"), "command_latency" -> ("latency", ""); ValueError naming anything else."""
    if name == LATENCY:
        return "latency", ""
    target, dot, kind = name.rpartition(".")
    if not dot or not target or kind not in PHYSICS_PARAM:
        raise ValueError(
            f"overlay parameter {name!r} is not <joint>.armature|damping|frictionloss, <actuator>.kp or {LATENCY}"
        )
    return kind, target


@dataclass
class ModelOverlay:
    robot: str
    parameters: dict[str, float]  # name -> absolute value
    half_width_95: dict[str, float] = field(default_factory=dict)
    not_identified: list[str] = field(default_factory=list)

    def validate(self) -> None:
        for name, value in self.parameters.items():
            kind, _ = split_name(name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"overlay {name} must be a finite number, got {value!r}")
            if kind == "kp" and value <= 0:
                raise ValueError(f"overlay {name} (a stiffness) must be > 0, got {value!r}")
            if value < 0:
                raise ValueError(f"overlay {name} must be >= 0, got {value!r}")
            if kind == "latency" and value > MAX_LATENCY_S:
                raise ValueError(f"overlay {name} must be at most {MAX_LATENCY_S} s, got {value!r}")

    @property
    def command_latency(self) -> float:
        """Seconds; 0 where the overlay identified none."""
        return float(self.parameters.get(LATENCY, 0.0))

    def of_kind(self, kind: str) -> dict[str, float]:
        """target -> value of one kind's parameters."""
        picked = {}
        for name, value in self.parameters.items():
            name_kind, target = split_name(name)
            if name_kind == kind:
                picked[target] = value
        return picked

    def save(self, path: str | Path) -> None:
        self.validate()
        document = {
            "robot": self.robot,
            "parameters": {name: float(value) for name, value in self.parameters.items()},
            "half_width_95": {name: float(value) for name, value in self.half_width_95.items()},
            "not_identified": list(self.not_identified),
        }
        Path(path).write_text(yaml.safe_dump(document, sort_keys=False))

    def apply_to_spec(self, spec) -> None:
        """Write the joint and actuator parameters into an MjSpec (mujoco.MjSpec) before it compiles; the latency
        is not the model's. Names a joint or an actuator the spec lacks."""
        for name, value in self.parameters.items():
            kind, target = split_name(name)
            if kind == "latency":
                continue
            if kind == "kp":
                actuator = spec.actuator(target)
                if actuator is None:
                    raise KeyError(f"overlay {name}: the model has no actuator {target!r}")
                if actuator.biasprm[1] != -actuator.gainprm[0]:
                    raise ValueError(f"overlay {name}: actuator {target!r} is not a position actuator (kp, -kp)")
                actuator.gainprm[0], actuator.biasprm[1] = value, -value
                continue
            joint = spec.joint(target)
            if joint is None:
                raise KeyError(f"overlay {name}: the model has no joint {target!r}")
            if kind == "damping":
                joint.damping[0] = value  # an array in MjSpec: [viscous, polynomial terms]
            else:
                setattr(joint, kind, value)

    def apply_to_backend(self, backend) -> None:
        """Write the joint and actuator parameters into every env of a simulated task's backend
        (`SimBackend.set_physics`), which recomputes what depends on them."""
        every = torch.arange(backend.num_envs)
        for kind, param in PHYSICS_PARAM.items():
            values = self.of_kind(kind)
            if values:
                column = torch.tensor(list(values.values()), dtype=torch.float64)
                backend.set_physics(param, every, list(values), column.expand(backend.num_envs, -1))


def load_overlay(path: str | Path) -> ModelOverlay:
    """The overlay in `path`, validated; names the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model overlay {str(path)!r} does not exist (robotrl-sysid writes one)")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"model overlay {path}: not YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("parameters"), dict):
        raise ValueError(f"model overlay {path}: expected a mapping with 'robot' and 'parameters', got {document!r}")
    unknown = sorted(set(document) - {"robot", "parameters", "half_width_95", "not_identified"})
    if unknown:
        raise ValueError(f"model overlay {path}: unknown keys {unknown}")
    overlay = ModelOverlay(
        robot=str(document.get("robot", "")),
        parameters=dict(document["parameters"]),
        half_width_95=dict(document.get("half_width_95") or {}),
        not_identified=list(document.get("not_identified") or []),
    )
    try:
        overlay.validate()
    except ValueError as error:
        raise ValueError(f"model overlay {path}: {error}") from None
    return overlay
