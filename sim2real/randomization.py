"""Domain randomization of a simulated task's physics: per-env values drawn at start-up, at each reset or every k
control steps, written through the backend's `set_physics` (so on MuJoCo and Genesis alike), every draw logged.

A term names a physical parameter (tasks/backend.py:PHYSICS_PARAMS), a target (the robot's links, joints and
actuators, the scene's loose objects, or the world), how a draw changes the nominal value (scale, add, set) and
the distribution it comes from. Draws come from one CPU generator in a fixed order, so a seed gives the same per-env
values on either simulator. Configured as `randomization=none|default|wide` (configs/randomization/), each key
overridable (`randomization.terms.object_mass.high=1.5`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import torch
from robotrl.tasks.arm_task import ArmTask
from robotrl.tasks.backend import (
    NON_NEGATIVE_PARAMS as NON_NEGATIVE,
)
from robotrl.tasks.backend import (
    PHYSICS_PARAMS,
    VISUAL_PARAMS,
    SimBackend,
)
from robotrl.tasks.backend import (
    POSITIVE_PARAMS as POSITIVE,
)

DISTRIBUTIONS = ("uniform", "log_uniform", "gaussian")
OPERATIONS = ("scale", "add", "set")
WHEN = ("startup", "reset", "interval")
TARGETS = {
    "body": ("robot", "object", "scene"),  # scene: the world body's geoms (the floor that serves as the table)
    "joint": ("robot",),
    "actuator": ("robot",),
    "world": ("world",),
    "camera": ("camera",),  # the cameras the task's pixel observations come from
    "light": ("light",),  # the scene's named lights
}
NOT_SCALED = frozenset({"body_com", "camera_pos", "camera_tilt", "light_pos"})  # positions and turns: add or set


@dataclass
class RandomizationTerm:
    param: str = "body_mass"  # a physics parameter: body_mass, body_com, friction, joint_*, actuator_gain, gravity
    target: str = "robot"  # robot (its links, joints, actuators) | object (the scene's loose bodies) | world
    operation: str = "scale"  # scale: nominal x draw | add: nominal + draw | set: the draw itself
    distribution: str = "uniform"  # uniform | log_uniform (both within [low, high]) | gaussian (truncated to them)
    low: float = 1.0
    high: float = 1.0
    mean: float | None = None  # gaussian: its centre; None: the middle of [low, high]
    std: float = 0.0  # gaussian: its spread before truncation
    when: str = "reset"  # startup: once per env | reset: at every episode start | interval: every `every` steps
    every: int = 0  # interval: control steps between draws, per env
    shared: bool = False  # one draw for all of the target's items in an env (a whole-arm gain error), not one each

    def validate(self, key: str) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{key}.{name} {why}, got {getattr(self, name)!r}")

        if self.param not in PHYSICS_PARAMS:
            raise bad("param", f"must be one of {', '.join(PHYSICS_PARAMS)}")
        kind = PHYSICS_PARAMS[self.param][0]
        if self.target not in TARGETS[kind]:
            raise bad("target", f"of {self.param} must be one of {', '.join(TARGETS[kind])}")
        if self.operation not in OPERATIONS:
            raise bad("operation", f"must be one of {', '.join(OPERATIONS)}")
        if self.param == "body_size" and self.target != "object":
            raise bad("target", "of body_size must be object: a task re-reads the sizes of its loose objects only")
        if self.param == "body_size" and self.when == "interval":
            # a task reads each object's size when it places it (reset_scene): resized mid-episode, the object
            # would sink into the table or jump, and the task would judge it by its old size
            raise bad("when", "of body_size must be startup or reset")
        if self.param in NOT_SCALED and self.operation == "scale":
            raise bad("operation", f"of {self.param} must be add or set (a position or a turn does not scale)")
        if self.distribution not in DISTRIBUTIONS:
            raise bad("distribution", f"must be one of {', '.join(DISTRIBUTIONS)}")
        for name in ("low", "high"):
            if not math.isfinite(getattr(self, name)):
                raise bad(name, "must be finite")
        if self.low > self.high:
            raise ValueError(f"{key}: the range [low, high] = [{self.low}, {self.high}] is empty")
        if self.distribution == "log_uniform" and self.low <= 0:
            raise bad("low", "of a log_uniform range must be > 0")
        if self.distribution == "gaussian":
            if not (math.isfinite(self.std) and self.std > 0):
                raise bad("std", "of a gaussian must be a finite number > 0")
            if self.mean is not None and not (math.isfinite(self.mean) and self.low <= self.mean <= self.high):
                raise bad("mean", f"must lie within [low, high] = [{self.low}, {self.high}]")
        if self.operation in ("scale", "set"):
            if self.param in POSITIVE and self.low <= 0:
                raise bad("low", f"would make {self.param} <= 0 ({self.operation}); it must be > 0")
            if self.param in NON_NEGATIVE and self.low < 0:
                raise bad("low", f"would make {self.param} negative ({self.operation}); it must be >= 0")
        if self.when not in WHEN:
            raise bad("when", f"must be one of {', '.join(WHEN)}")
        if (self.when == "interval") != (self.every >= 1):
            raise bad("every", "must be >= 1 with when=interval and 0 otherwise")


@dataclass
class RandomizationConfig:
    name: str = "none"  # the preset this came from (configs/randomization/<name>.yaml), for the run's records
    terms: dict[str, RandomizationTerm] = field(default_factory=dict)  # none: the nominal model, unchanged
    # An asymmetric critic: SAC's critic also reads every term's values in force (an observation entry the actor
    # never sees, sim2real/privileged.py), so it judges each episode under the physics drawn for it rather than
    # their average. robotrl-train with agent=sac only; a deployed policy needs nothing more.
    privileged: bool = False

    def validate(self) -> None:
        for key, term in self.terms.items():
            term.validate(f"randomization.terms.{key}")
        if self.privileged and not self.terms:
            raise ValueError(
                f"randomization.privileged=true gives the critic the drawn physics, and randomization={self.name} "
                "draws none: choose a preset with terms (default, wide)"
            )


@dataclass(frozen=True)
class RandomizationTargets:
    """The names each target addresses in one task's scene."""

    robot_bodies: tuple[str, ...]
    robot_joints: tuple[str, ...]
    robot_actuators: tuple[str, ...]
    objects: tuple[str, ...]
    cameras: tuple[str, ...] = ()  # the pixel observations' cameras; () where the task observes no pixels
    lights: tuple[str, ...] = ()
    renders: bool = False  # whether anything the policy sees is rendered: visual terms apply only then
    resizable: tuple[str, ...] = ()  # the loose objects whose size the task allows to change (body_size)

    @classmethod
    def of_task(cls, task: ArmTask) -> RandomizationTargets:
        """The robot's joints (gripper included), the bodies they move, its actuators, the scene's loose objects
        (bodies with a free joint), those it allows to be resized and, where the task observes pixels, its cameras and
        the scene's lights."""
        joints = task.robot.joints + (task.robot.gripper.joints if task.robot.gripper is not None else ())
        actuators = task.arm_actuators + (("gripper",) if task.robot.gripper is not None else ())
        bodies = tuple(dict.fromkeys(task.backend.joint_bodies(joints)))
        renders = task.cfg.obs != "state"
        cameras = tuple(task.cfg.cameras) if renders else ()
        lights = task.backend.lights() if renders else ()
        objects = task.backend.free_bodies()
        resizable = tuple(name for name in task.resizable_objects if name in objects)
        return cls(bodies, joints, actuators, objects, cameras, lights, renders, resizable)

    def names(self, term: RandomizationTerm) -> tuple[str, ...]:
        """What `term` changes in this scene; () where it has nothing to change (no loose object, none the task lets
        change size, no pixels)."""
        kind = PHYSICS_PARAMS[term.param][0]
        if term.param == "body_size":
            return self.resizable
        if term.param in VISUAL_PARAMS and not self.renders:
            return ()
        if kind == "world":
            return ("world",)
        if kind == "camera":
            return self.cameras
        if kind == "light":
            return self.lights
        if kind == "joint":
            return self.robot_joints
        if kind == "actuator":
            return self.robot_actuators
        return {"robot": self.robot_bodies, "object": self.objects, "scene": ("world",)}[term.target]


def stream_seed(seed: int, stream: str) -> int:
    """A seed for one of a run's random streams, drawn from the run's `seed`: the task's generator, seeded with the
    run's seed itself, draws the episodes' layouts, and a second generator seeded alike would repeat its draws."""
    return int(np.random.SeedSequence([seed, *stream.encode()]).generate_state(1)[0])


def sample(term: RandomizationTerm, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """float64 draws of `term`'s distribution."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    if term.distribution == "uniform":
        return term.low + (term.high - term.low) * u
    if term.distribution == "log_uniform":
        return torch.exp(math.log(term.low) + (math.log(term.high) - math.log(term.low)) * u)
    # truncated normal by inverse transform: exact, one draw each, no rejection loop
    mean = (term.low + term.high) / 2 if term.mean is None else term.mean
    cdf = torch.special.ndtr(torch.tensor([(term.low - mean) / term.std, (term.high - mean) / term.std]))
    inside = cdf[0] + (cdf[1] - cdf[0]) * u
    return (mean + term.std * torch.special.ndtri(inside)).clamp(term.low, term.high)


class _Term:
    """One configured term bound to a scene: its names, nominal values and the values in force per env."""

    def __init__(self, key: str, term: RandomizationTerm, names: tuple[str, ...], nominal: torch.Tensor, envs: int):
        self.key, self.term, self.names = key, term, names
        self.nominal = nominal  # [n, *shape] float64
        self.values = nominal.expand(envs, *nominal.shape).clone()
        self.since = torch.zeros(envs, dtype=torch.long)  # interval terms: control steps since each env's last draw
        if term.operation == "add":
            lowest = (nominal + term.low).min().item()
            if (term.param in POSITIVE and lowest <= 0) or (term.param in NON_NEGATIVE and lowest < 0):
                raise ValueError(
                    f"randomization.terms.{key}.low={term.low} would make {term.param} of {list(names)} "
                    f"{'<= 0' if term.param in POSITIVE else 'negative'} (nominal {nominal.tolist()})"
                )

    def draw(self, count: int, generator: torch.Generator) -> torch.Tensor:
        shape = (count, 1 if self.term.shared else len(self.names), *self.nominal.shape[1:])
        drawn = sample(self.term, shape, generator).expand(count, *self.nominal.shape)
        if self.term.operation == "scale":
            return self.nominal * drawn
        if self.term.operation == "add":
            return self.nominal + drawn
        return drawn.clone()


class PhysicsRandomizer:
    """Draws its terms per env and writes them through `backend`, from its own generator seeded with `seed`; a
    TaskVecEnv calls `on_reset` and `on_step` (tasks/arm_task.py:TaskEvents). `values()` holds what each env runs
    with now; `log` (a path) gets one JSON line per env and draw: the control step, the env, when, and every drawn
    value by term and name."""

    def __init__(
        self,
        cfg: RandomizationConfig,
        backend: SimBackend,
        targets: RandomizationTargets,
        seed: int,
        log: Path | None = None,
    ):
        cfg.validate()
        self.backend = backend
        self.num_envs = backend.num_envs
        self.generator = torch.Generator().manual_seed(stream_seed(seed, "randomization"))
        self.terms: list[_Term] = []
        for key, term in cfg.terms.items():
            names = targets.names(term)
            if not names:
                continue  # a task without loose objects has nothing for an object term to change
            if term.param in backend.uniform_params:
                raise ValueError(
                    f"randomization.terms.{key}: {term.param} cannot differ per env on the {type(backend).__name__} "
                    "(one geometry for all envs): use task.backend=mujoco, or leave the term out"
                )
            nominal = backend.physics(term.param, names)[0].to("cpu", torch.float64)
            self.terms.append(_Term(key, term, names, nominal, self.num_envs))
        self._step = 0
        self._started = False
        self._log: IO[str] | None = None
        if log is not None and self.terms:
            log.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log, "a", buffering=1)

    def values(self) -> dict[str, torch.Tensor]:
        """Each term's values in force, [E, n, *shape] float64, by term key."""
        return {term.key: term.values.clone() for term in self.terms}

    def value_names(self) -> list[str]:
        """What each column of `relative_values` is: `<term>.<name>`, with `[i]` per component of a vector value."""
        names = []
        for term in self.terms:
            components = math.prod(term.nominal.shape[1:])
            for name in term.names:
                names += (
                    [f"{term.key}.{name}"]
                    if components == 1
                    else [f"{term.key}.{name}[{i}]" for i in range(components)]
                )
        return names

    def relative_values(self) -> torch.Tensor:
        """[E, P] float32: every value in force as its change from nominal (value / nominal - 1), or the value
        itself where the nominal is 0 (a joint friction of a frictionless model): 0 means nominal physics."""
        columns = []
        for term in self.terms:
            nominal = term.nominal.expand_as(term.values)
            relative = torch.where(nominal != 0, term.values / torch.where(nominal != 0, nominal, 1.0) - 1, term.values)
            columns.append(relative.reshape(self.num_envs, -1))
        return torch.cat(columns, dim=1).float()

    def on_reset(self, env_ids: torch.Tensor) -> None:
        """Before the task places the scene of `env_ids`: the start-up draws once (all envs), then the reset draws."""
        if not self._started:
            self._started = True
            everyone = torch.arange(self.num_envs)
            self._draw(("startup", "interval"), everyone)
        self._draw(("reset",), env_ids.cpu())

    def on_step(self) -> None:
        self._step += 1
        due: dict[str, torch.Tensor] = {}
        for term in self.terms:
            if term.term.when == "interval":
                term.since += 1
                ids = (term.since >= term.term.every).nonzero().flatten()
                if len(ids):
                    due[term.key] = ids
        if due:
            self._draw(("interval",), due)

    def _draw(self, when: tuple[str, ...], env_ids: torch.Tensor | dict[str, torch.Tensor]) -> None:
        """Draw the terms of kinds `when` for `env_ids` (or, per term key, the envs due)."""
        drawn: dict[str, torch.Tensor] = {}
        for term in self.terms:
            ids = env_ids.get(term.key) if isinstance(env_ids, dict) else env_ids
            if term.term.when not in when or ids is None:
                continue
            values = term.draw(len(ids), self.generator)
            self.backend.set_physics(term.term.param, ids, term.names, values)
            term.values[ids] = values
            term.since[ids] = 0
            drawn[term.key] = ids
        if drawn and self._log is not None:
            self._write(when[0], drawn)

    def _write(self, when: str, drawn: dict[str, torch.Tensor]) -> None:
        by_env: dict[int, dict] = {}
        for term in self.terms:
            ids = drawn.get(term.key)
            if ids is None:
                continue
            for env in ids.tolist():
                by_env.setdefault(env, {})[term.key] = dict(zip(term.names, term.values[env].tolist(), strict=True))
        for env, values in sorted(by_env.items()):
            self._log.write(json.dumps({"step": self._step, "env": env, "when": when, "values": values}) + "\n")

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
