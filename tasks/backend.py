"""The simulator interface a task is written against: batched, torch in and out.

A task never touches a simulator's own API. Every query and command carries a leading `num_envs`
dimension; `env_ids` selects a subset for resets. MuJoCo implements this now (mujoco_backend.py); a
second simulator must implement the same methods and no task may need to change for it.
Quaternions are (w, x, y, z).
Physical parameters (masses, frictions, joint and actuator properties, gravity) are read and written per env
through `physics` and `set_physics` (PHYSICS_PARAMS), which domain randomization and system identification use.
State comes back on the backend's `device` (the CPU for MuJoCo, the simulator's device for Genesis), so a
task's per-step math runs where the state lives; setters take tensors on any device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

# The physical parameters a backend reads and writes per env: name -> (what its names address, one item's shape).
PHYSICS_PARAMS: dict[str, tuple[str, tuple[int, ...]]] = {
    # kg; the body's inertia scales with it (the same shape, denser), as a real part of other material does
    "body_mass": ("body", ()),
    "body_com": ("body", (3,)),  # m: the centre of mass in the body's frame
    # sliding friction of a body's colliding geoms as one value, the largest (MuJoCo's contacts take the larger of
    # two geoms'); a write scales each of them by the same factor, keeping a fingertip pad's friction above its link's
    "friction": ("body", ()),
    "joint_damping": ("joint", ()),  # N m s / rad (N s / m for a slide joint)
    "joint_armature": ("joint", ()),  # kg m^2: rotor inertia reflected through the gearbox
    "joint_frictionloss": ("joint", ()),  # N m: dry friction
    "actuator_gain": ("actuator", ()),  # a position actuator's stiffness kp (its damping kv stays)
    "gravity": ("world", (3,)),  # m/s^2; its one name is "world"
    # a factor on a loose object's nominal size: its geoms' sizes and their offsets in the body scale alike, the mass
    # stays (the inertia scales with the size squared); a task that allows it re-reads the size to place the object
    # (ArmTask.resizable_objects). Primitive shapes only: a mesh's vertices are compiled into the model
    "body_size": ("body", ()),
    # What a camera sees, not physics (a backend that renders; pixel observations): relative to the nominal scene
    "camera_pos": ("camera", (3,)),  # m: the camera's position in its body's frame
    "camera_tilt": ("camera", (3,)),  # rad: a rotation vector turning the camera from its nominal orientation
    "camera_fovy": ("camera", ()),  # degrees: the vertical field of view
    "light_pos": ("light", (3,)),  # m
    "light_diffuse": ("light", (3,)),  # rgb intensity
    # rgb factors on a body's geoms' nominal colours (clipped to 1); a geom with a material tints the material, so
    # in that env every geom sharing it (the floor's grid: the table)
    "rgb_tint": ("body", (3,)),
}
VISUAL_PARAMS = frozenset({"camera_pos", "camera_tilt", "camera_fovy", "light_pos", "light_diffuse", "rgb_tint"})


def check_physics_param(param: str, names: Sequence[str]) -> tuple[str, tuple[int, ...]]:
    """(what the names address, item shape) of `param`, or ValueError naming it."""
    if param not in PHYSICS_PARAMS:
        raise ValueError(f"unknown physics parameter {param!r}; known: {', '.join(PHYSICS_PARAMS)}")
    kind, shape = PHYSICS_PARAMS[param]
    if kind == "world" and tuple(names) != ("world",):
        raise ValueError(f"{param} has one value per env, named 'world'; got names {list(names)}")
    return kind, shape


# quantities that cannot be zero or negative, and those that cannot be negative (randomization checks its ranges
# against the same sets at start-up)
POSITIVE_PARAMS = frozenset({"body_mass", "body_size", "friction", "actuator_gain", "camera_fovy"})
NON_NEGATIVE_PARAMS = frozenset({"joint_damping", "joint_armature", "joint_frictionloss", "light_diffuse", "rgb_tint"})


def check_physics_values(param: str, names: Sequence[str], values: torch.Tensor, count: int) -> torch.Tensor:
    """`values` for `count` envs as float64 on the CPU, or ValueError naming the parameter and the bad value: a
    wrong shape, a non-finite value, a mass, size, friction, gain or field of view <= 0, a joint damping, armature or
    friction, a light or a tint < 0."""
    _, shape = check_physics_param(param, names)
    expected = (count, len(names), *shape)
    values = values.detach().to("cpu", torch.float64)
    if tuple(values.shape) != expected:
        raise ValueError(f"{param}: values must have shape {list(expected)}, got {list(values.shape)}")
    if not torch.isfinite(values).all():
        raise ValueError(f"{param} of {list(names)} must be finite, got {values.tolist()}")
    if param in POSITIVE_PARAMS and (values <= 0).any():
        raise ValueError(f"{param} of {list(names)} must be > 0, got {values.tolist()}")
    if param == "camera_fovy" and (values >= 180).any():
        raise ValueError(f"{param} of {list(names)} must be below 180 degrees, got {values.tolist()}")
    if param in NON_NEGATIVE_PARAMS and (values < 0).any():
        raise ValueError(f"{param} of {list(names)} must be >= 0, got {values.tolist()}")
    return values


class SimBackend(ABC):
    num_envs: int
    physics_dt: float
    device: torch.device = torch.device("cpu")
    # physical parameters this simulator holds alike in every env: physics() reads them as nominal, and randomization
    # refuses a term on one at start-up
    uniform_params: frozenset[str] = frozenset()

    def deepest_penetration(self) -> float | None:
        """How deep, in metres, the deepest contact of any env penetrates now (0 without one); None where the backend
        does not report contact distances. A longer physics step lets bodies sink further into each other before
        the contact pushes back: tasks/expert_rollout.py reads it to judge a physics setting."""
        return None

    @abstractmethod
    def joint_pos(self, joints: Sequence[str]) -> torch.Tensor:
        """[E, len(joints)] positions of hinge/slide joints."""

    @abstractmethod
    def joint_vel(self, joints: Sequence[str]) -> torch.Tensor:
        """[E, len(joints)] velocities of hinge/slide joints."""

    @abstractmethod
    def set_joint_state(
        self, env_ids: torch.Tensor, joints: Sequence[str], pos: torch.Tensor, vel: torch.Tensor | None = None
    ) -> None:
        """Set positions (and velocities, else zero) of `joints` in the envs `env_ids` ([K] long)."""

    @abstractmethod
    def set_free_body_pose(self, env_ids: torch.Tensor, body: str, pos: torch.Tensor, quat: torch.Tensor) -> None:
        """Place a body that has a free joint; its velocity is zeroed."""

    @abstractmethod
    def set_mocap_pose(
        self, env_ids: torch.Tensor, body: str, pos: torch.Tensor, quat: torch.Tensor | None = None
    ) -> None:
        """Move (and, given `quat`, turn) a mocap body (markers, targets, fixtures) in the envs `env_ids`."""

    @abstractmethod
    def set_actuators(self, actuators: Sequence[str], values: torch.Tensor) -> None:
        """Targets [E, len(actuators)] for the named actuators (position actuators take joint targets)."""

    @abstractmethod
    def step(self, substeps: int) -> None:
        """Advance every env by `substeps` physics steps."""

    @abstractmethod
    def forward(self, env_ids: torch.Tensor | None = None) -> None:
        """Recompute derived quantities (poses, Jacobians) after states were set."""

    @abstractmethod
    def site_pose(self, site: str) -> tuple[torch.Tensor, torch.Tensor]:
        """World position [E, 3] and orientation quaternion [E, 4] of a site."""

    @abstractmethod
    def body_pose(self, body: str) -> tuple[torch.Tensor, torch.Tensor]:
        """World position [E, 3] and orientation quaternion [E, 4] of a body."""

    @abstractmethod
    def site_jacobian(self, site: str, joints: Sequence[str]) -> torch.Tensor:
        """[E, 6, len(joints)]: rows 0-2 translational, 3-5 rotational, columns for `joints`."""

    @abstractmethod
    def in_contact(self, geoms_a: Sequence[str], geoms_b: Sequence[str]) -> torch.Tensor:
        """[E] bool: any geom of `geoms_a` touches any geom of `geoms_b`."""

    @abstractmethod
    def render(self, camera: str, width: int, height: int) -> torch.Tensor:
        """[E, H, W, 3] uint8 images from a named camera."""

    @abstractmethod
    def physics(self, param: str, names: Sequence[str]) -> torch.Tensor:
        """[E, len(names), *shape] per-env values of a physical parameter (PHYSICS_PARAMS) as the simulator now uses
        them."""

    @abstractmethod
    def set_physics(self, param: str, env_ids: torch.Tensor, names: Sequence[str], values: torch.Tensor) -> None:
        """Write [K, len(names), *shape] values of `param` in the envs `env_ids`; whatever the simulator derives from
        them (a MuJoCo model's constants at qpos0) is recomputed, and the envs' states are left as they were."""

    @abstractmethod
    def joint_bodies(self, joints: Sequence[str]) -> tuple[str, ...]:
        """The body each joint moves."""

    @abstractmethod
    def free_bodies(self) -> tuple[str, ...]:
        """The bodies with a free joint: the scene's loose objects."""

    @abstractmethod
    def lights(self) -> tuple[str, ...]:
        """The scene's named lights."""

    def close(self) -> None:  # noqa: B027  (optional hook)
        pass
