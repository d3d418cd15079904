"""Names a task's scene answers from its compiled MjModel, which both backends hold (the Genesis backend compiles
the MJCF with MuJoCo to split it): the body a joint moves, the loose objects, the lights."""

from __future__ import annotations

from collections.abc import Sequence

import mujoco


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
