"""The robot's MJCF in MuJoCo, for the tool point's pose and Jacobian at a measured joint position: the robot
env's `ee_pos` and held points (observation) and its ee_delta IK (actions)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco

from robotrl.core.robot_spec import RobotSpec

ASSETS = Path(__file__).resolve().parent.parent / "tasks" / "assets"


def rotation_matrix(quat: np.ndarray) -> np.ndarray:
    """The 3x3 rotation of a unit quaternion (w, x, y, z)."""
    matrix = np.zeros(9)
    mujoco.mju_quat2Mat(matrix, np.asarray(quat, dtype=np.float64))
    return matrix.reshape(3, 3)


class Kinematics:
    """Forward kinematics of the robot's MJCF at a joint position (the arm's joints; the rest stay at 0)."""

    def __init__(self, model_file: Path, spec: RobotSpec):
        self.model = mujoco.MjModel.from_xml_path(str(model_file))
        self.data = mujoco.MjData(self.model)
        ids = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in spec.joints]
        if min(ids) < 0:
            raise KeyError(f"{model_file} lacks joints of robot {spec.name!r}: {spec.joints}")
        self.qpos = self.model.jnt_qposadr[ids]
        self.dofs = self.model.jnt_dofadr[ids]
        self.site = -1
        if spec.end_effector_site is not None:
            self.site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, spec.end_effector_site)
            if self.site < 0:
                raise KeyError(f"{model_file} has no site {spec.end_effector_site!r}")

    def site_positions(self, q: np.ndarray, sites: tuple[str, ...]) -> np.ndarray:
        """[len(sites), 3] positions of the named MJCF sites at joint position q (a hand's palm and fingertips)."""
        ids = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, name) for name in sites]
        missing = [name for name, i in zip(sites, ids, strict=True) if i < 0]
        if missing:
            raise KeyError(f"the robot's model has no sites {missing}")
        self.data.qpos[self.qpos] = q
        mujoco.mj_kinematics(self.model, self.data)
        return self.data.site_xpos[ids].copy()

    def pose(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(position [3], quaternion wxyz [4], Jacobian [6, n]) of the tool point at joint position q."""
        self.data.qpos[self.qpos] = q
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)
        jacp = np.zeros((3, self.model.nv))
        jacr = np.zeros((3, self.model.nv))
        mujoco.mj_jacSite(self.model, self.data, jacp, jacr, self.site)
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, self.data.site_xmat[self.site])
        jac = np.concatenate([jacp[:, self.dofs], jacr[:, self.dofs]])
        return self.data.site_xpos[self.site].copy(), quat, jac
