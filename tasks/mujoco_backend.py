"""SimBackend on MuJoCo: one MjData per env, stepped in turn, sharing one MjModel until a physical parameter of an
env is written (set_physics); that env then steps on its own copy of the model. Sixteen copies step at 0.97-0.98 of
one shared model's speed (panda_pick_cube, interleaved per control step, 2026-11-28)."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import numpy as np
import torch
from robotrl.tasks.backend import SimBackend, check_physics_param, check_physics_values
from robotrl.tasks.scene_names import (
    HINGE_OR_SLIDE,
    check_position_actuators,
    colliding_geoms,
    free_bodies,
    joint_bodies,
    light_names,
    resizable_parts,
)

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco

_WARNING = mujoco.mjtWarning
_UNSTABLE = np.array([int(w) for w in (_WARNING.mjWARN_BADQPOS, _WARNING.mjWARN_BADQVEL, _WARNING.mjWARN_BADQACC)])


def _instability_count(data) -> int:
    return int(data.warning.number[_UNSTABLE].sum())


# Parameters MuJoCo derives constants from at qpos0 (body_subtreemass, dof_invweight0, actuator_acc0, ...): a write
# is followed by mj_setConst, so the model equals one compiled with the new values (tests/test_randomization.py).
_NEEDS_SET_CONST = frozenset({"body_mass", "body_com", "body_size", "joint_armature"})


def scene_spec(xml: str | Path) -> mujoco.MjSpec:
    """The scene as the backend compiles it. Loose objects (bodies with a free joint) are not compiled as "simple":
    MuJoCo's shortcut for a body whose centre of mass sits at its origin fixes the mass matrix's sparsity at compile
    time, and a centre of mass moved at run time (randomization) would break it (mj_setConst refuses)."""
    spec = mujoco.MjSpec.from_file(str(xml))
    for body in spec.bodies:
        if any(joint.type == mujoco.mjtJoint.mjJNT_FREE for joint in body.joints):
            body.simple = 0
    return spec


class MujocoBackend(SimBackend):
    """`threads` > 1 steps the envs on a thread pool (MuJoCo releases the GIL inside mj_step)."""

    def __init__(self, xml: str | Path, num_envs: int = 1, threads: int = 1, physics_dt: float | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if threads < 1:
            raise ValueError(f"task.sim_threads must be >= 1, got {threads}")
        threads = min(threads, num_envs)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="mujoco") if threads > 1 else None
        spec = scene_spec(xml)
        if physics_dt is not None:
            spec.option.timestep = physics_dt
        self.model = spec.compile()  # the nominal model
        self.models = [self.model] * num_envs  # each env's model: the nominal one until set_physics writes its own
        self.datas = [mujoco.MjData(self.model) for _ in range(num_envs)]
        self._scratch = mujoco.MjData(self.model)  # mj_setConst's workspace, so no env's state is touched
        # the relative visual parameters each env runs with: camera turns from nominal, colour factors per body
        self._tilt = np.zeros((num_envs, self.model.ncam, 3))
        self._view_option = mujoco.MjvOption()  # what a frame shows: MuJoCo's defaults, as mujoco.Renderer's
        self._tint = np.ones((num_envs, self.model.nbody, 3))
        self._size = np.ones((num_envs, self.model.nbody))  # body_size factors
        self.num_envs = num_envs
        self.physics_dt = float(self.model.opt.timestep)
        # one per image size: pixel observations and videos differ, and rebuilding a renderer takes ~100 ms
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}
        self._jac = np.zeros((6, self.model.nv))
        # Queries read from tensors built once per state: a task asks for the same poses several times a
        # step (observation, reward, controller), and each build costs a pass over every MjData.
        self._snapshot: dict = {}
        for data in self.datas:
            mujoco.mj_forward(self.model, data)
        self._instabilities = [_instability_count(d) for d in self.datas]  # MuJoCo's count after each step

    # -- name lookups (cached: names are resolved once) ------------------------------------------
    @cache  # noqa: B019  (the backend lives as long as its env)
    def _joint_addr(self, joints: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        qpos, qvel = [], []
        for name in joints:
            joint = self._named(mujoco.mjtObj.mjOBJ_JOINT, name, "joint")
            if int(self.model.jnt_type[joint]) not in HINGE_OR_SLIDE:
                raise ValueError(f"joint {name!r} is not a hinge or slide joint")
            qpos.append(self.model.jnt_qposadr[joint])
            qvel.append(self.model.jnt_dofadr[joint])
        return np.array(qpos), np.array(qvel)

    def _named(self, kind, name: str, what: str) -> int:
        idx = mujoco.mj_name2id(self.model, kind, name)
        if idx < 0:
            raise KeyError(f"{what} {name!r} is not in model {self.model.names[:40]!r}...")
        return idx

    @cache  # noqa: B019
    def _ids(self, kind, names: tuple[str, ...], what: str) -> np.ndarray:
        return np.array([self._named(kind, n, what) for n in names])

    @cache  # noqa: B019
    def _joint_index(self, joints: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        qpos, qvel = self._joint_addr(joints)
        return torch.from_numpy(qpos), torch.from_numpy(qvel)

    def _stacked(self, field: str) -> torch.Tensor:
        """[E, ...] float32 copy of an MjData array, built once until the state changes."""
        hit = self._snapshot.get(field)
        if hit is None:
            hit = self._snapshot[field] = torch.from_numpy(np.stack([getattr(d, field) for d in self.datas])).float()
        return hit

    def _changed(self) -> None:
        self._snapshot.clear()

    # -- state -----------------------------------------------------------------------------------
    def joint_pos(self, joints: Sequence[str]) -> torch.Tensor:
        return self._stacked("qpos").index_select(1, self._joint_index(tuple(joints))[0])

    def joint_vel(self, joints: Sequence[str]) -> torch.Tensor:
        return self._stacked("qvel").index_select(1, self._joint_index(tuple(joints))[1])

    def set_joint_state(self, env_ids, joints, pos, vel=None) -> None:
        self._changed()
        qadr, vadr = self._joint_addr(tuple(joints))
        pos = pos.detach().cpu().double().numpy()
        vel = np.zeros_like(pos) if vel is None else vel.detach().cpu().double().numpy()
        for k, i in enumerate(env_ids.tolist()):
            self.datas[i].qpos[qadr] = pos[k]
            self.datas[i].qvel[vadr] = vel[k]

    def set_free_body_pose(self, env_ids, body, pos, quat) -> None:
        self._changed()
        body_id = self._named(mujoco.mjtObj.mjOBJ_BODY, body, "body")
        joint = self.model.body_jntadr[body_id]
        if joint < 0 or int(self.model.jnt_type[joint]) != int(mujoco.mjtJoint.mjJNT_FREE):
            raise ValueError(f"body {body!r} has no free joint")
        qadr, vadr = self.model.jnt_qposadr[joint], self.model.jnt_dofadr[joint]
        pose = torch.cat([pos, quat], -1).detach().cpu().double().numpy()
        for k, i in enumerate(env_ids.tolist()):
            self.datas[i].qpos[qadr : qadr + 7] = pose[k]
            self.datas[i].qvel[vadr : vadr + 6] = 0.0

    def set_mocap_pose(self, env_ids, body, pos, quat=None) -> None:
        self._changed()
        mocap = self.model.body_mocapid[self._named(mujoco.mjtObj.mjOBJ_BODY, body, "body")]
        if mocap < 0:
            raise ValueError(f"body {body!r} is not a mocap body")
        pos = pos.detach().cpu().double().numpy()
        quat = None if quat is None else quat.detach().cpu().double().numpy()
        for k, i in enumerate(env_ids.tolist()):
            self.datas[i].mocap_pos[mocap] = pos[k]
            if quat is not None:
                self.datas[i].mocap_quat[mocap] = quat[k]

    def set_actuators(self, actuators, values) -> None:
        ids = self._ids(mujoco.mjtObj.mjOBJ_ACTUATOR, tuple(actuators), "actuator")
        values = values.detach().cpu().double().numpy()
        for data, row in zip(self.datas, values, strict=True):
            data.ctrl[ids] = row

    def step(self, substeps: int) -> None:
        self._changed()
        if self._pool is None:
            for i in range(self.num_envs):
                self._step_env(i, substeps)
        else:
            list(self._pool.map(self._step_env, range(self.num_envs), [substeps] * self.num_envs))

    def _step_env(self, i: int, substeps: int) -> None:
        data = self.datas[i]
        before = self._instabilities[i]
        mujoco.mj_step(self.models[i], data, nstep=substeps)
        self._instabilities[i] = _instability_count(data)
        if self._instabilities[i] != before:
            # MuJoCo resets a diverged MjData to its initial state and carries on; a silent teleport
            # would reach the policy and the replay buffer as if it were physics.
            raise FloatingPointError(
                f"MuJoCo simulation of env {i} diverged (NaN/Inf or huge values in qpos, qvel or qacc) "
                f"at time {data.time:.3f} s; lower the timestep or the gains"
            )

    def deepest_penetration(self) -> float:
        deepest = 0.0
        for data in self.datas:
            if data.ncon:
                deepest = max(deepest, -float(data.contact.dist[: data.ncon].min()))
        return deepest

    def forward(self, env_ids=None) -> None:
        self._changed()
        targets = range(self.num_envs) if env_ids is None else env_ids.tolist()
        for i in targets:
            mujoco.mj_forward(self.models[i], self.datas[i])

    # -- physical parameters -----------------------------------------------------------------------
    @cache  # noqa: B019
    def _param_ids(self, param: str, names: tuple[str, ...]):
        """Where `param` of `names` lives in a model: body, dof or actuator ids; for friction each body's geoms."""
        kind, _ = check_physics_param(param, names)
        model = self.model
        if kind == "body":
            bodies = self._ids(mujoco.mjtObj.mjOBJ_BODY, names, "body")
            if param == "body_mass" and (model.body_mass[bodies] <= 0).any():
                raise ValueError(f"body_mass: bodies {list(names)} include one without mass (the world?)")
            if param == "rgb_tint":
                return [np.flatnonzero(model.geom_bodyid == body) for body in bodies], bodies
            if param == "body_size":
                return resizable_parts(model, names, bodies)
            if param != "friction":
                return bodies
            return colliding_geoms(model, names, bodies)
        if kind == "joint":
            return self._joint_addr(names)[1]
        if kind == "camera":
            return self._ids(mujoco.mjtObj.mjOBJ_CAMERA, names, "camera")
        if kind == "light":
            return self._ids(mujoco.mjtObj.mjOBJ_LIGHT, names, "light")
        if kind == "actuator":
            acts = self._ids(mujoco.mjtObj.mjOBJ_ACTUATOR, names, "actuator")
            check_position_actuators(model, names, acts)
            return acts
        return None  # gravity

    def _resize(self, i: int, model: mujoco.MjModel, resized, values: np.ndarray) -> None:
        """Scale each body's shapes to `values` times nominal, keeping its mass and the centre-of-mass offset that
        body_com added: positions in the body scale, so do the bounding volumes (in the inertial frame)."""
        nominal = self.model
        for (body, geoms, sites), size in zip(resized, values, strict=True):
            ratio = size / self._size[i, body]
            for field in ("geom_size", "geom_pos", "geom_rbound", "geom_aabb"):
                getattr(model, field)[geoms] = getattr(nominal, field)[geoms] * size
            model.site_pos[sites] = nominal.site_pos[sites] * size
            model.site_size[sites] = nominal.site_size[sites] * size
            offset = model.body_ipos[body] - nominal.body_ipos[body] * self._size[i, body]  # body_com's shift
            start, count = model.body_bvhadr[body], model.body_bvhnum[body]
            if count > 0:
                rotation = np.empty(9)
                mujoco.mju_quat2Mat(rotation, model.body_iquat[body])
                aabb = model.bvh_aabb[start : start + count]
                aabb[:, :3] = aabb[:, :3] * ratio + (ratio - 1.0) * (rotation.reshape(3, 3).T @ offset)
                aabb[:, 3:] *= ratio
            model.body_ipos[body] = nominal.body_ipos[body] * size + offset
            model.body_inertia[body] *= ratio**2
            self._size[i, body] = size

    def _read(self, i: int, param: str, ids) -> np.ndarray:
        model = self.models[i]
        if param == "body_size":
            return self._size[i, [body for body, _, _ in ids]]
        if param == "camera_tilt":
            return self._tilt[i, ids]
        if param == "rgb_tint":
            return self._tint[i, ids[1]]
        if param == "camera_pos":
            return model.cam_pos[ids]
        if param == "camera_fovy":
            return model.cam_fovy[ids]
        if param == "light_pos":
            return model.light_pos[ids]
        if param == "light_diffuse":
            return model.light_diffuse[ids]
        if param == "body_mass":
            return model.body_mass[ids]
        if param == "body_com":
            return model.body_ipos[ids]
        if param == "friction":
            return np.array([model.geom_friction[geoms, 0].max() for geoms in ids])
        if param == "joint_damping":
            return model.dof_damping[ids]
        if param == "joint_armature":
            return model.dof_armature[ids]
        if param == "joint_frictionloss":
            return model.dof_frictionloss[ids]
        if param == "actuator_gain":
            return model.actuator_gainprm[ids, 0]
        return model.opt.gravity[None].copy()

    def _write(self, i: int, param: str, ids, values: np.ndarray) -> None:
        model, nominal = self.models[i], self.model
        if param == "camera_tilt":
            for cam, rotation in zip(ids, values, strict=True):
                turn = np.empty(4)
                mujoco.mju_axisAngle2Quat(
                    turn, rotation / max(np.linalg.norm(rotation), 1e-12), np.linalg.norm(rotation)
                )
                mujoco.mju_mulQuat(model.cam_quat[cam], nominal.cam_quat[cam], turn)
            self._tilt[i, ids] = values
        elif param == "rgb_tint":
            geoms_of, columns = ids
            for geoms, body, tint in zip(geoms_of, columns, values, strict=True):
                for geom in geoms:
                    material = nominal.geom_matid[geom]
                    if material >= 0:
                        model.mat_rgba[material, :3] = np.minimum(nominal.mat_rgba[material, :3] * tint, 1.0)
                    else:
                        model.geom_rgba[geom, :3] = np.minimum(nominal.geom_rgba[geom, :3] * tint, 1.0)
                self._tint[i, body] = tint
        elif param == "camera_pos":
            model.cam_pos[ids] = values
        elif param == "camera_fovy":
            model.cam_fovy[ids] = values
        elif param == "light_pos":
            model.light_pos[ids] = values
        elif param == "light_diffuse":
            model.light_diffuse[ids] = values
        elif param == "body_size":
            self._resize(i, model, ids, values)
        elif param == "body_mass":
            model.body_inertia[ids] *= (values / model.body_mass[ids])[:, None]
            model.body_mass[ids] = values
        elif param == "body_com":
            # a body's bounding volumes are stored in its inertial frame, which moves with the centre of mass
            for body, com in zip(ids, values, strict=True):
                start, count = model.body_bvhadr[body], model.body_bvhnum[body]
                if count > 0:
                    rotation = np.empty(9)
                    mujoco.mju_quat2Mat(rotation, model.body_iquat[body])
                    shift = rotation.reshape(3, 3).T @ (com - model.body_ipos[body])
                    model.bvh_aabb[start : start + count, :3] -= shift
            model.body_ipos[ids] = values
        elif param == "friction":
            for geoms, value in zip(ids, values, strict=True):
                model.geom_friction[geoms, 0] *= value / model.geom_friction[geoms, 0].max()
        elif param == "joint_damping":
            model.dof_damping[ids] = values
        elif param == "joint_armature":
            model.dof_armature[ids] = values
        elif param == "joint_frictionloss":
            model.dof_frictionloss[ids] = values
        elif param == "actuator_gain":
            model.actuator_gainprm[ids, 0] = values
            model.actuator_biasprm[ids, 1] = -values
        else:
            model.opt.gravity[:] = values[0]

    def physics(self, param, names):
        ids = self._param_ids(param, tuple(names))
        return torch.from_numpy(np.stack([self._read(i, param, ids) for i in range(self.num_envs)])).float()

    def set_physics(self, param, env_ids, names, values):
        ids = self._param_ids(param, tuple(names))
        env_list = env_ids.tolist()
        values = check_physics_values(param, names, values, len(env_list)).numpy()
        self._changed()
        for k, i in enumerate(env_list):
            if self.models[i] is self.model:
                self.models[i] = copy.copy(self.model)
            self._write(i, param, ids, values[k])
            if param in _NEEDS_SET_CONST:
                mujoco.mj_setConst(self.models[i], self._scratch)
        if param in ("camera_pos", "camera_tilt", "light_pos"):
            self.forward(env_ids)  # cameras and lights are placed by kinematics: the next frame sees them moved

    def lights(self):
        return light_names(self.model)

    def joint_bodies(self, joints):
        return joint_bodies(self.model, joints)

    def free_bodies(self):
        return free_bodies(self.model)

    # -- kinematics ------------------------------------------------------------------------------
    def site_pose(self, site):
        sid = self._named(mujoco.mjtObj.mjOBJ_SITE, site, "site")
        key = ("site_quat", sid)
        quat = self._snapshot.get(key)
        if quat is None:
            quats = np.zeros((self.num_envs, 4))
            for k, d in enumerate(self.datas):
                mujoco.mju_mat2Quat(quats[k], d.site_xmat[sid])
            quat = self._snapshot[key] = torch.from_numpy(quats).float()
        return self._stacked("site_xpos")[:, sid].clone(), quat.clone()

    def body_pose(self, body):
        bid = self._named(mujoco.mjtObj.mjOBJ_BODY, body, "body")
        return self._stacked("xpos")[:, bid].clone(), self._stacked("xquat")[:, bid].clone()

    def site_jacobian(self, site, joints):
        sid = self._named(mujoco.mjtObj.mjOBJ_SITE, site, "site")
        _, vadr = self._joint_addr(tuple(joints))
        key = ("jacobian", sid, tuple(joints))
        jac = self._snapshot.get(key)
        if jac is None:
            out = np.empty((self.num_envs, 6, len(vadr)))
            for k, d in enumerate(self.datas):
                mujoco.mj_jacSite(self.model, d, self._jac[:3], self._jac[3:], sid)  # kinematics: no parameters
                out[k] = self._jac[:, vadr]
            jac = self._snapshot[key] = torch.from_numpy(out).float()
        return jac.clone()

    def _contact_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every env's active contacts as one [C, 2] geom-pair array and the [C] env of each row."""
        hit = self._snapshot.get("contacts")
        if hit is None:
            pairs = [d.contact.geom[: d.ncon] for d in self.datas]  # array views, no per-contact objects
            counts = np.fromiter((len(p) for p in pairs), dtype=np.int64, count=self.num_envs)
            hit = self._snapshot["contacts"] = (np.concatenate(pairs), np.repeat(np.arange(self.num_envs), counts))
        return hit

    def in_contact(self, geoms_a, geoms_b):
        in_a, in_b = self._geom_mask(tuple(geoms_a)), self._geom_mask(tuple(geoms_b))
        pairs, env = self._contact_pairs()
        g1, g2 = pairs[:, 0], pairs[:, 1]
        touching = (in_a[g1] & in_b[g2]) | (in_b[g1] & in_a[g2])
        out = np.zeros(self.num_envs, dtype=bool)
        out[env[touching]] = True
        return torch.from_numpy(out)

    @cache  # noqa: B019
    def _geom_mask(self, geoms: tuple[str, ...]) -> np.ndarray:
        mask = np.zeros(self.model.ngeom, dtype=bool)
        mask[self._ids(mujoco.mjtObj.mjOBJ_GEOM, geoms, "geom")] = True
        return mask

    def render(self, camera, width, height):
        renderer = self._renderers.get((width, height))
        if renderer is None:
            try:
                renderer = mujoco.Renderer(self.model, height=height, width=width)
            except Exception as err:
                raise RuntimeError(
                    f"MuJoCo could not create a renderer ({err}); on a headless machine set MUJOCO_GL=egl "
                    "(or MUJOCO_GL=osmesa where EGL is missing)"
                ) from err
            self._renderers[(width, height)] = renderer
        view = mujoco.MjvCamera()
        view.type, view.fixedcamid = (
            mujoco.mjtCamera.mjCAMERA_FIXED,
            self._named(mujoco.mjtObj.mjOBJ_CAMERA, camera, "camera"),
        )
        frames = np.empty((self.num_envs, height, width, 3), dtype=np.uint8)
        for k, d in enumerate(self.datas):
            # each env's own model: its field of view, lights and colours (randomization) are read from it
            mujoco.mjv_updateScene(
                self.models[k], d, self._view_option, None, view, mujoco.mjtCatBit.mjCAT_ALL, renderer.scene
            )
            frames[k] = renderer.render()
        return torch.from_numpy(frames)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()
