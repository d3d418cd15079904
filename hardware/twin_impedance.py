"""The simulated twin's Cartesian impedance controller, as a Franka runs it for HIL-SERL (franka_ros's
cartesian_impedance_example_controller, serl_franka_controllers): the tool point is pulled toward an equilibrium
pose by a spring and a damper in task space, the arm's redundancy toward a rest pose, every physics step:

    tau = J^T (K (x_eq - x) - D J qdot) + N^T (K_null (q_null - q) - D_null qdot) + c(q, qdot)

x is the tool site's position and orientation (the orientation error an axis-angle vector in the world frame), J
its 6 x n Jacobian over the arm's joints, c the Coriolis and gravity forces the model does not already cancel
(MuJoCo's `gravcomp` bodies cancel their own weight, as a Franka's firmware does), N^T = I - J^T Lambda J M^-1
the dynamically consistent nullspace projector (Lambda = (J M^-1 J^T)^-1, the tool's task-space inertia).
The damping is modal (double diagonalization; Albu-Schaeffer, Ott, Frese, Hirzinger, ICRA 2003): with
K^-1/2 Lambda K^-1/2 = V diag(m) V^T, D = K^1/2 V diag(2 zeta sqrt(m)) V^T K^1/2, so that every task-space mode of
the arm has damping ratio `damping_ratio` whatever its inertia (franka's D = 2 sqrt(K) assumes a 1 kg tool: the
twin's Panda, 5-12 kg along the axes at home, would be left at 0.3-0.46); D_null = 2 zeta sqrt(K_null M_ii)
per joint. The torque is then limited in rate (as franka's example's saturateTorqueRate, from the torque in force
before) and clipped to the joints' effort limits, in that order, so that neither bound is ever exceeded.

hardware/sim_twin.py runs it while equilibrium poses arrive on its `impedance_topic`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

# A unit quaternion's norm may be off by this much. Rounding to 4 decimals (a pose typed into a launch file, a
# log) moves the norm by at most 2e-4 and float32 arithmetic by ~1e-7, so those pass; four numbers that are not a
# rotation (Euler angles in the fields, a zero or scaled quaternion) are off by far more. Accepted ones are
# normalized before use.
QUAT_NORM_TOLERANCE = 1e-3
_EIGEN_FLOOR = 1e-9  # 1/kg: keeps Lambda^1/2 finite where the Jacobian loses rank (a singular pose)


def check_gains(
    stiffness: Sequence[float],
    damping_ratio: float,
    nullspace_stiffness: float,
    torque_rate_limit: float,
    effort_limit: Sequence[float] | None = None,
    prefix: str = "",
) -> None:
    """Raise ValueError naming the first bad gain (`prefix` + its name, as a config spells it) and its value."""

    def finite(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not (isinstance(stiffness, Sequence) and len(stiffness) == 6):
        raise ValueError(
            f"{prefix}stiffness must have 6 values (3 translational N/m, then 3 rotational Nm/rad), got {stiffness!r}"
        )
    for i, value in enumerate(stiffness):
        if not (finite(value) and value > 0):
            raise ValueError(f"{prefix}stiffness[{i}] must be a finite number > 0, got {value!r}")
    if not (finite(damping_ratio) and damping_ratio > 0):
        raise ValueError(f"{prefix}damping_ratio must be a finite number > 0, got {damping_ratio!r}")
    if not (finite(nullspace_stiffness) and nullspace_stiffness >= 0):
        raise ValueError(
            f"{prefix}nullspace_stiffness must be a finite number >= 0 (Nm/rad), got {nullspace_stiffness!r}"
        )
    if not (finite(torque_rate_limit) and torque_rate_limit > 0):
        raise ValueError(f"{prefix}torque_rate_limit must be a finite number > 0 (Nm/s), got {torque_rate_limit!r}")
    if effort_limit is not None:
        if not (isinstance(effort_limit, Sequence) and len(effort_limit) > 0):
            raise ValueError(f"{prefix}effort_limit must be a list of Nm, one per joint, got {effort_limit!r}")
        for i, value in enumerate(effort_limit):
            if not (finite(value) and value > 0):
                raise ValueError(f"{prefix}effort_limit[{i}] must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class ImpedanceGains:
    stiffness: tuple[float, ...]  # 3 translational (N/m), 3 rotational (Nm/rad), in the world frame's axes
    damping_ratio: float  # zeta of the task-space and nullspace modes (1: critically damped)
    nullspace_stiffness: float  # Nm/rad toward the rest pose, within the nullspace of the task
    effort_limit: tuple[float, ...]  # Nm per joint
    torque_rate_limit: float  # Nm/s per joint (Franka's example controller: 1 Nm per 1 ms cycle)

    def __post_init__(self) -> None:
        check_gains(
            list(self.stiffness),
            self.damping_ratio,
            self.nullspace_stiffness,
            self.torque_rate_limit,
            list(self.effort_limit),
        )


def pose_error(position: np.ndarray, quat: np.ndarray, site_position: np.ndarray, site_quat: np.ndarray) -> np.ndarray:
    """x_eq minus x: [translation (3), rotation as an axis-angle vector in the world frame (3)], from the
    equilibrium (`position`, unit `quat` wxyz) and the site's pose; the rotation takes the short way round."""
    local = np.zeros(3)
    mujoco.mju_subQuat(local, np.asarray(quat, dtype=np.float64), np.asarray(site_quat, dtype=np.float64))
    rotation = np.zeros(9)
    mujoco.mju_quat2Mat(rotation, np.asarray(site_quat, dtype=np.float64))
    return np.concatenate([np.asarray(position) - site_position, rotation.reshape(3, 3) @ local])


def unit_quaternion(quat: Sequence[float]) -> np.ndarray:
    """`quat` normalized; ValueError if it has non-finite values or its norm is not within QUAT_NORM_TOLERANCE
    of 1 (the message is not a rotation)."""
    quat = np.asarray(quat, dtype=np.float64)
    if quat.shape != (4,) or not np.isfinite(quat).all():
        raise ValueError(f"a quaternion needs 4 finite values, got {quat.tolist()}")
    norm = float(np.linalg.norm(quat))
    if abs(norm - 1.0) > QUAT_NORM_TOLERANCE:
        raise ValueError(f"quaternion {quat.tolist()} has norm {norm:.6g}, not within {QUAT_NORM_TOLERANCE} of 1")
    return quat / norm


class CartesianImpedance:
    """Joint torques pulling tool site `site` of `model` toward an equilibrium pose: the arm's joints are
    `qpos_ids` (their qpos addresses) and `dof_ids` (their dof addresses, one each), their rest pose
    `nullspace_pose`. `torques()` reads `data`'s kinematics, mass matrix and bias forces as they stand: call it
    after mj_step1 (or mj_forward) and apply its result before mj_step2."""

    def __init__(
        self,
        model: mujoco.MjModel,
        data: mujoco.MjData,
        qpos_ids: Sequence[int],
        dof_ids: Sequence[int],
        site: int,
        gains: ImpedanceGains,
        nullspace_pose: Sequence[float],
    ):
        self.qpos_ids = np.asarray(qpos_ids, dtype=np.int64)
        self.dof_ids = np.asarray(dof_ids, dtype=np.int64)
        n = len(self.dof_ids)
        if n == 0 or len(self.qpos_ids) != n:
            raise ValueError(f"need one qpos and one dof address per joint, got {len(qpos_ids)} and {n}")
        if ((self.dof_ids < 0) | (self.dof_ids >= model.nv)).any() or (
            (self.qpos_ids < 0) | (self.qpos_ids >= model.nq)
        ).any():
            raise ValueError(
                f"joint addresses {self.qpos_ids.tolist()} / {self.dof_ids.tolist()} lie outside the model"
            )
        if not 0 <= site < model.nsite:
            raise ValueError(f"site id {site} is not in the model (it has {model.nsite} sites)")
        if len(gains.effort_limit) != n:
            raise ValueError(f"effort_limit has {len(gains.effort_limit)} values for {n} joints")
        self.nullspace_pose = np.asarray(nullspace_pose, dtype=np.float64)
        if self.nullspace_pose.shape != (n,) or not np.isfinite(self.nullspace_pose).all():
            raise ValueError(f"nullspace_pose must be {n} finite joint positions, got {self.nullspace_pose.tolist()}")
        self.model, self.data, self.site, self.gains = model, data, site, gains
        self.stiffness = np.asarray(gains.stiffness, dtype=np.float64)
        self.effort_limit = np.asarray(gains.effort_limit, dtype=np.float64)
        self.max_step = gains.torque_rate_limit * float(model.opt.timestep)  # Nm per physics step
        self.torque = np.zeros(n)  # the torque in force: where the rate limit starts from
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))
        self._mass = np.zeros((model.nv, model.nv))

    def reset(self, torque: Sequence[float]) -> None:
        """Start the rate limit from `torque` (Nm per joint): what the joints received before this controller."""
        torque = np.asarray(torque, dtype=np.float64)
        if torque.shape != self.torque.shape or not np.isfinite(torque).all():
            raise ValueError(f"reset needs {len(self.torque)} finite torques, got {torque.tolist()}")
        self.torque = np.clip(torque, -self.effort_limit, self.effort_limit)

    def site_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """The tool site's world position [3] and orientation (wxyz) [4] in `data` as it stands."""
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, self.data.site_xmat[self.site])
        return self.data.site_xpos[self.site].copy(), quat

    def torques(self, position: Sequence[float], quat: Sequence[float]) -> np.ndarray:
        """The joint torques (Nm) toward equilibrium `position` (m, world frame) and unit `quat` (wxyz), limited in
        rate and effort; also kept as `self.torque`."""
        position = np.asarray(position, dtype=np.float64)
        if position.shape != (3,) or not np.isfinite(position).all():
            raise ValueError(f"equilibrium position must be 3 finite values, got {position.tolist()}")
        quat = unit_quaternion(quat)
        model, data, dofs = self.model, self.data, self.dof_ids
        mujoco.mj_jacSite(model, data, self._jacp, self._jacr, self.site)
        jac = np.concatenate([self._jacp[:, dofs], self._jacr[:, dofs]])
        mujoco.mj_fullM(model, data, self._mass)
        mass = self._mass[np.ix_(dofs, dofs)]
        qvel = data.qvel[dofs]

        inv_mass_jt = np.linalg.solve(mass, jac.T)  # M^-1 J^T
        inv_lambda = jac @ inv_mass_jt  # J M^-1 J^T: symmetric, positive semi-definite
        eigenvalues, vectors = np.linalg.eigh(inv_lambda)
        eigenvalues = np.maximum(eigenvalues, _EIGEN_FLOOR)
        task_inertia = (vectors / eigenvalues) @ vectors.T  # Lambda
        # Modal damping (double diagonalization): in coordinates where K^-1/2 Lambda K^-1/2 = V diag(m) V^T is
        # diagonal the modes decouple, m_i y'' + d_i y' + y = 0, and d_i = 2 zeta sqrt(m_i) gives each ratio zeta
        sqrt_stiffness = np.sqrt(self.stiffness)
        masses, modes = np.linalg.eigh(task_inertia / np.outer(sqrt_stiffness, sqrt_stiffness))
        shape = sqrt_stiffness[:, None] * modes
        zeta = self.gains.damping_ratio
        damping = (shape * (2.0 * zeta * np.sqrt(np.maximum(masses, 0.0)))) @ shape.T

        error = pose_error(position, quat, *self.site_pose())
        task = jac.T @ (self.stiffness * error - damping @ (jac @ qvel))

        nullspace_damping = 2.0 * zeta * np.sqrt(self.gains.nullspace_stiffness * np.diag(mass))
        rest = (
            self.gains.nullspace_stiffness * (self.nullspace_pose - data.qpos[self.qpos_ids]) - nullspace_damping * qvel
        )
        projector_t = np.eye(len(dofs)) - jac.T @ task_inertia @ inv_mass_jt.T  # N^T = I - J^T Lambda J M^-1
        # What the model does not already cancel: its gravcomp bodies' weight is held by passive forces
        bias = data.qfrc_bias[dofs] - data.qfrc_gravcomp[dofs]

        wanted = task + projector_t @ rest + bias
        step = np.clip(wanted - self.torque, -self.max_step, self.max_step)
        self.torque = np.clip(self.torque + step, -self.effort_limit, self.effort_limit)
        return self.torque.copy()
