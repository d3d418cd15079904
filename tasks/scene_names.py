"""Names and parts a task's scene answers from its compiled MjModel, which every backend holds (the Genesis backend
compiles the MJCF with MuJoCo to split it): the body a joint moves, the loose objects, the lights, and the geoms
and actuators a physical parameter of a body or actuator addresses (refused by name where it cannot)."""

from __future__ import annotations

from collections.abc import Sequence

import mujoco
import numpy as np

HINGE_OR_SLIDE = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
# shapes whose size a model holds in geom_size (a mesh, height field or SDF compiles its shape into other arrays)
PRIMITIVES = frozenset(
    int(t)
    for t in (
        mujoco.mjtGeom.mjGEOM_SPHERE,
        mujoco.mjtGeom.mjGEOM_CAPSULE,
        mujoco.mjtGeom.mjGEOM_ELLIPSOID,
        mujoco.mjtGeom.mjGEOM_CYLINDER,
        mujoco.mjtGeom.mjGEOM_BOX,
    )
)


def joint_bodies(model: mujoco.MjModel, joints: Sequence[str]) -> tuple[str, ...]:
    """The body each joint moves; KeyError naming a joint the scene lacks."""
    out = []
    for name in joints:
        joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if joint < 0:
            raise KeyError(f"joint {name!r} is not in the scene")
        out.append(model.body(int(model.jnt_bodyid[joint])).name)
    return tuple(out)


def free_bodies(model: mujoco.MjModel) -> tuple[str, ...]:
    """The bodies with a free joint: the scene's loose objects."""
    free = int(mujoco.mjtJoint.mjJNT_FREE)
    return tuple(model.body(int(model.jnt_bodyid[j])).name for j in range(model.njnt) if int(model.jnt_type[j]) == free)


def light_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """The scene's named lights (an unnamed light cannot be addressed)."""
    return tuple(name for i in range(model.nlight) if (name := mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_LIGHT, i)))


def colliding_geoms(model: mujoco.MjModel, names: Sequence[str], bodies: Sequence[int]) -> list[np.ndarray]:
    """Each body's colliding geoms (what its `friction` scales); ValueError naming a body with none."""
    colliding = (model.geom_contype | model.geom_conaffinity) != 0
    out = []
    for name, body in zip(names, bodies, strict=True):
        own = np.flatnonzero((model.geom_bodyid == body) & colliding)
        if len(own) == 0:
            raise ValueError(f"friction: body {name!r} has no colliding geom")
        out.append(own)
    return out


def resizable_parts(
    model: mujoco.MjModel, names: Sequence[str], bodies: Sequence[int]
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(body, its geoms, its sites) per body, checked to have a size the model holds (primitive geoms); ValueError
    naming a body without geoms or with a mesh, height field or plane."""
    out = []
    for name, body in zip(names, bodies, strict=True):
        geoms = np.flatnonzero(model.geom_bodyid == body)
        if len(geoms) == 0:
            raise ValueError(f"body_size: body {name!r} has no geom to resize")
        if any(int(t) not in PRIMITIVES for t in model.geom_type[geoms]):
            raise ValueError(
                f"body_size: body {name!r} has a mesh, height field or plane geom; only spheres, "
                "capsules, ellipsoids, cylinders and boxes can be resized"
            )
        out.append((int(body), geoms, np.flatnonzero(model.site_bodyid == body)))
    return out


def check_position_actuators(model: mujoco.MjModel, names: Sequence[str], actuators: np.ndarray) -> None:
    """ValueError unless every actuator is a position actuator (its bias pulls toward the target with its gain)."""
    if not np.allclose(model.actuator_biasprm[actuators, 1], -model.actuator_gainprm[actuators, 0]):
        raise ValueError(f"actuator_gain: actuators {list(names)} include one that is not a position actuator")
