"""SimBackend on MuJoCo Warp: MuJoCo's physics for every env at once, as warp kernels on a GPU (or warp's CPU device),
torch in and out.

The scene is compiled as the MuJoCo backend compiles it (mujoco_backend.scene_spec) and put on the device with one
world per env (`mujoco_warp.put_model`, `put_data`). Each physical parameter of PHYSICS_PARAMS has a per-world copy
in the model, written in place through torch views; after a mass, centre of mass, size or armature change the
constants MuJoCo derives from them are recomputed (`mujoco_warp.set_const`), as the MuJoCo backend's mj_setConst.
State, poses, the site Jacobian and contacts are read from zero-copy torch views of the warp arrays. A step replays a
captured graph of `substeps` physics steps: a plain `mujoco_warp.step` costs ~10 ms of Python kernel launches whatever
the number of envs, a replay ~0.2 ms plus the kernels' own time. Frames are drawn by `mujoco.Renderer` from each
env's poses in a C MuJoCo copy of the scene (built at the first frame, ~0.5 MB per env), so they equal the MuJoCo
backend's; the camera, light and colour parameters live in that copy.

mujoco-warp and warp-lang are imported lazily: `pip install -e ".[warp]"` provides them. Warp runs on CUDA when torch
sees a GPU, else on warp's CPU device; state is returned there (`self.device`), where the task computes.

Measured on a 2-core CPU machine shared with another job (warp's CPU device, 2026-11-29; not run on a GPU here):
- the first scene of a fresh machine compiles its kernels for ~55 s (panda_pick_cube; each further scene ~5 s),
  cached under ~/.cache/warp (~10 MB; WARP_CACHE_PATH moves it); with the cache warm a backend is built in ~2.6 s.
- everything is float32: open loop it follows the MuJoCo backend to ~2e-6 rad over 100 control steps, and the
  scripted experts succeed as often (tests/test_warp_backend.py). Contacts can differ at float32 edges (a box exactly
  touching the floor), and MULTICCD makes one contact, not several, for the capsule-cylinder and cylinder-box pairs.
- speed: warp's CPU kernels run on one thread: panda_pick_cube steps ~18k env physics steps/s at 16 to 256 envs
  (11k at 1 env), C MuJoCo ~75-84k on one thread, and the scripted expert's 10 envs run 300 control steps/s
  against 660 on task.backend=mujoco. On a CPU this backend is ~4x slower than C MuJoCo: it is for GPUs.
Not carried over: C MuJoCo's reset of a diverged env (a step raises FloatingPointError naming it, as the MuJoCo
backend does), the noslip and PGS solvers and plugins (mujoco_warp refuses them; no shipped scene uses them).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import mujoco
import numpy as np
import torch
from robotrl.tasks.backend import VISUAL_PARAMS, SimBackend, check_physics_param, check_physics_values
from robotrl.tasks.mujoco_backend import MujocoBackend, scene_spec
from robotrl.tasks.scene_names import (
    HINGE_OR_SLIDE,
    check_position_actuators,
    colliding_geoms,
    free_bodies,
    joint_bodies,
    light_names,
    resizable_parts,
)

log = logging.getLogger(__name__)

INSTALL_HINT = 'the warp extra: pip install -e ".[warp]"'

# Model fields held per world: what set_physics writes, and what set_const derives from it. set_const writes each
# derived field with that field's own batch size, so one left shared would get world 0's value in every world.
_PER_WORLD_PARAMS = (
    "body_mass",
    "body_inertia",
    "body_ipos",
    "geom_friction",
    "geom_size",
    "geom_pos",
    "geom_rbound",
    "geom_aabb",
    "site_pos",
    "dof_damping",
    "dof_armature",
    "dof_frictionloss",
    "actuator_gainprm",
    "actuator_biasprm",
)
_DERIVED = ("body_subtreemass", "body_invweight0", "dof_invweight0", "actuator_acc0")
_NEEDS_SET_CONST = frozenset({"body_mass", "body_com", "body_size", "joint_armature"})
# What the queries and frames read of an env's last forward pass. A forward pass runs on every world: the envs it was
# not asked for get these back, so their poses and contacts stay those of their last step, as on the MuJoCo backend.
_POSES = ("xpos", "xquat", "xmat", "site_xpos", "site_xmat", "geom_xpos", "geom_xmat", "cdof", "subtree_com")
# Contacts and constraint rows each env may hold. The shipped scenes peak at 11 contacts and 82 rows (hand_reorient;
# panda_pick_cube 9 and 55) in C MuJoCo under the scripted experts; rows grow with joint friction (randomization).
# Contacts share one buffer of nconmax * num_envs. Far too small a buffer can crash mujoco_warp 3.11 outright rather
# than flag the overflow (nconmax=2 on panda_pick_cube segfaulted in its narrowphase).
NCONMAX = 64
NJMAX = 192
# mujoco_warp's overflow bits (OverflowType, types.py of 3.11): too many constraint rows (nefc, Jacobian non-zeros),
# too many contacts (broadphase pairs, narrowphase contacts, CCD contacts)
_TOO_MANY_ROWS = 0b11
_TOO_MANY_CONTACTS = 0b11100
_MULTICCD_WARNING = "MULTICCD is enabled, but the scene contains CCD pairs without multicontact support"


def import_warp():
    """(warp, mujoco_warp), or ImportError naming the extra that provides them."""
    try:
        import mujoco_warp as mjw
        import warp as wp
    except ImportError as err:
        raise ImportError(
            f"task.backend=mujoco_warp needs mujoco-warp and warp-lang, which are not installed; install {INSTALL_HINT}"
        ) from err
    # a line per kernel module loaded (about a hundred per scene) at the default level; the compile's wait is logged
    # by the backend instead
    wp.config.log_level = wp.LOG_WARNING
    return wp, mjw


def _mat_to_quat(mat: torch.Tensor) -> torch.Tensor:
    """[..., 3, 3] rotation matrices to (w, x, y, z) quaternions, by MuJoCo's mju_mat2Quat (its branch and sign)."""
    m = mat.reshape(*mat.shape[:-2], 9)
    m0, m1, m2, m3, m4, m5, m6, m7, m8 = m.unbind(-1)
    trace = m0 + m4 + m8
    candidates = []
    for large, diagonal, others in (
        (0, 1 + trace, (m7 - m5, m2 - m6, m3 - m1)),
        (1, 1 + m0 - m4 - m8, (m7 - m5, m1 + m3, m2 + m6)),
        (2, 1 - m0 + m4 - m8, (m2 - m6, m1 + m3, m5 + m7)),
        (3, 1 - m0 - m4 + m8, (m3 - m1, m2 + m6, m5 + m7)),
    ):
        big = 0.5 * diagonal.clamp(min=1e-12).sqrt()
        rest = [0.25 * o / big for o in others]
        rest.insert(large, big)
        candidates.append(torch.stack(rest, -1))
    branch = torch.where(
        trace > 0,
        0,
        torch.where((m0 > m4) & (m0 > m8), 1, torch.where(m4 > m8, 2, 3)),
    )
    quat = torch.stack(candidates, -2).gather(-2, branch[..., None, None].expand(*branch.shape, 1, 4)).squeeze(-2)
    return quat / quat.norm(dim=-1, keepdim=True)


class MujocoWarpBackend(SimBackend):
    """`nconmax`: contacts per env, `njmax`: constraint rows per env (a step that needs more raises, naming them)."""

    def __init__(
        self,
        xml: str | Path,
        num_envs: int = 1,
        physics_dt: float | None = None,
        nconmax: int = NCONMAX,
        njmax: int = NJMAX,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        wp, mjw = import_warp()
        self.wp, self.mjw = wp, mjw
        self.xml = Path(xml)
        spec = scene_spec(xml)
        if physics_dt is not None:
            spec.option.timestep = physics_dt
        self.model = spec.compile()  # the nominal model: names, nominal values, and the C scene frames are drawn in
        self.num_envs = num_envs
        self.physics_dt = float(self.model.opt.timestep)
        self.nconmax, self.njmax = nconmax, njmax
        if torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
            self._wp_device = f"cuda:{self.device.index}"
            # warp's work goes on torch's stream, ordered with the torch ops on the same memory
            self._stream = wp.stream_from_torch(torch.cuda.current_stream(self.device))
        else:
            self.device = torch.device("cpu")
            self._wp_device, self._stream = "cpu", None
        data = mujoco.MjData(self.model)  # qpos0; the forward pass below computes the rest on the device
        with self._on_device(), warnings.catch_warnings():
            # mujoco_warp makes one contact, not several, for capsule-cylinder and cylinder-box pairs (docstring)
            warnings.filterwarnings("ignore", message=_MULTICCD_WARNING)
            self.m = mjw.put_model(self.model, batch_sizes=dict.fromkeys(_PER_WORLD_PARAMS + _DERIVED, num_envs))
            # put_model does not batch these two option/statistic arrays: per-world copies replace them (before any
            # graph is captured: a captured graph holds the arrays it was captured with)
            self.m.opt.gravity = wp.array(np.tile(self.model.opt.gravity, (num_envs, 1)), dtype=wp.vec3)
            self.m.stat.meaninertia = wp.array(np.full(num_envs, self.model.stat.meaninertia), dtype=float)
            self.d = mjw.put_data(self.model, data, nworld=num_envs, nconmax=nconmax, njmax=njmax)
            # One eager step and forward in a scratch world loads (on a fresh machine: compiles) the kernels, which a
            # capture then records without running.
            log.info(
                "MuJoCo Warp: loading the kernels for %s (a fresh machine compiles them: ~55 s for the first scene on "
                "2 CPU cores, then cached in warp's kernel cache)",
                self.xml.name,
            )
            scratch = mjw.put_data(self.model, data, nworld=1, nconmax=nconmax, njmax=njmax)
            mjw.step(self.m, scratch)
            mjw.forward(self.m, scratch)
        self._graphs: dict[int, object] = {}  # substeps -> captured graph
        self._forward_graph = self._capture(mjw.forward)
        d, m = self.d, self.m
        self._state = {name: wp.to_torch(getattr(d, name)) for name in ("qpos", "qvel", "ctrl", "time", "overflow")}
        self._mocap_pos, self._mocap_quat = wp.to_torch(d.mocap_pos), wp.to_torch(d.mocap_quat)
        self._poses = {name: wp.to_torch(getattr(d, name)) for name in _POSES}
        self._contact = {
            "geom": wp.to_torch(d.contact.geom),
            "world": wp.to_torch(d.contact.worldid),
            "dist": wp.to_torch(d.contact.dist),
            "type": wp.to_torch(d.contact.type),
            "count": wp.to_torch(d.nacon),
        }
        self._params = {name: wp.to_torch(getattr(m, name)) for name in _PER_WORLD_PARAMS + _DERIVED}
        self._params["gravity"] = wp.to_torch(m.opt.gravity)
        self._params["meaninertia"] = wp.to_torch(m.stat.meaninertia)
        self._nominal = {name: view[0].clone() for name, view in self._params.items()}
        self._size = torch.ones(num_envs, self.model.nbody, device=self.device)  # body_size factors
        # the contacts of envs a forward pass was not asked for: (env, geom pairs, distance), from their last step
        self._kept_contacts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._kept_envs = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        self._scene: MujocoBackend | None = None  # the C copy frames are drawn in, built at the first frame
        self._launch(self._forward_graph)

    # -- warp ------------------------------------------------------------------------------------
    def _on_device(self):
        scope = contextlib.ExitStack()
        scope.enter_context(self.wp.ScopedDevice(self._wp_device))
        scope.enter_context(self.wp.ScopedStream(self._stream))
        return scope

    def _capture(self, function, repeat: int = 1):
        with self.wp.ScopedDevice(self._wp_device), self.wp.ScopedCapture(force_module_load=False) as capture:
            for _ in range(repeat):
                function(self.m, self.d)
        return capture.graph

    def _launch(self, graph) -> None:
        self.wp.capture_launch(graph, stream=self._stream)

    def _ids(self, env_ids: torch.Tensor) -> torch.Tensor:
        return env_ids.to(self.device, torch.long)

    def _in(self, values: torch.Tensor) -> torch.Tensor:
        return values.detach().to(self.device, torch.float32)

    def _on(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(ids).to(self.device)

    # -- name lookups (cached: names are resolved once) ------------------------------------------
    def _named(self, kind, name: str, what: str) -> int:
        idx = mujoco.mj_name2id(self.model, kind, name)
        if idx < 0:
            raise KeyError(f"{what} {name!r} is not in model {self.model.names[:40]!r}...")
        return idx

    @cache  # noqa: B019  (the backend lives as long as its env)
    def _ids_of(self, kind, names: tuple[str, ...], what: str) -> torch.Tensor:
        return torch.tensor([self._named(kind, n, what) for n in names], dtype=torch.long, device=self.device)

    @cache  # noqa: B019
    def _joint_addr(self, joints: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        qpos, qvel = [], []
        for name in joints:
            joint = self._named(mujoco.mjtObj.mjOBJ_JOINT, name, "joint")
            if int(self.model.jnt_type[joint]) not in HINGE_OR_SLIDE:
                raise ValueError(f"joint {name!r} is not a hinge or slide joint")
            qpos.append(int(self.model.jnt_qposadr[joint]))
            qvel.append(int(self.model.jnt_dofadr[joint]))
        return (torch.tensor(qpos, device=self.device), torch.tensor(qvel, device=self.device))

    @cache  # noqa: B019
    def _free_joint(self, body: str) -> tuple[int, int]:
        body_id = self._named(mujoco.mjtObj.mjOBJ_BODY, body, "body")
        joint = self.model.body_jntadr[body_id]
        if joint < 0 or int(self.model.jnt_type[joint]) != int(mujoco.mjtJoint.mjJNT_FREE):
            raise ValueError(f"body {body!r} has no free joint")
        return int(self.model.jnt_qposadr[joint]), int(self.model.jnt_dofadr[joint])

    @cache  # noqa: B019
    def _mocap(self, body: str) -> int:
        mocap = int(self.model.body_mocapid[self._named(mujoco.mjtObj.mjOBJ_BODY, body, "body")])
        if mocap < 0:
            raise ValueError(f"body {body!r} is not a mocap body")
        return mocap

    # -- state -----------------------------------------------------------------------------------
    def joint_pos(self, joints: Sequence[str]) -> torch.Tensor:
        return self._state["qpos"].index_select(1, self._joint_addr(tuple(joints))[0])

    def joint_vel(self, joints: Sequence[str]) -> torch.Tensor:
        return self._state["qvel"].index_select(1, self._joint_addr(tuple(joints))[1])

    def set_joint_state(self, env_ids, joints, pos, vel=None) -> None:
        qadr, vadr = self._joint_addr(tuple(joints))
        rows = self._ids(env_ids)[:, None]
        self._state["qpos"][rows, qadr] = self._in(pos)
        self._state["qvel"][rows, vadr] = 0.0 if vel is None else self._in(vel)

    def set_free_body_pose(self, env_ids, body, pos, quat) -> None:
        qadr, vadr = self._free_joint(body)
        ids = self._ids(env_ids)
        self._state["qpos"][ids, qadr : qadr + 7] = self._in(torch.cat([pos, quat.to(pos.device)], -1))
        self._state["qvel"][ids, vadr : vadr + 6] = 0.0

    def set_mocap_pose(self, env_ids, body, pos, quat=None) -> None:
        mocap, ids = self._mocap(body), self._ids(env_ids)
        self._mocap_pos[ids, mocap] = self._in(pos)
        if quat is not None:
            self._mocap_quat[ids, mocap] = self._in(quat)

    def set_actuators(self, actuators, values) -> None:
        ids = self._ids_of(mujoco.mjtObj.mjOBJ_ACTUATOR, tuple(actuators), "actuator")
        self._state["ctrl"][:, ids] = self._in(values)

    def step(self, substeps: int) -> None:
        if substeps < 1:
            raise ValueError(f"substeps must be >= 1, got {substeps}")
        graph = self._graphs.get(substeps)
        if graph is None:
            graph = self._graphs[substeps] = self._capture(self.mjw.step, substeps)
        self._launch(graph)
        self._kept_contacts = None
        self._kept_envs.zero_()
        self._check_step()

    def _check_step(self) -> None:
        """FloatingPointError naming the envs whose state is no longer finite (C MuJoCo would reset them and carry
        on; mujoco_warp carries on with NaN), RuntimeError naming nconmax or njmax where an env outgrew them."""
        qpos, qvel, overflow = self._state["qpos"], self._state["qvel"], self._state["overflow"]
        diverged = ~(torch.isfinite(qpos).all(1) & torch.isfinite(qvel).all(1))
        if not bool((diverged | (overflow != 0)).any()):  # the one host sync of a step
            return
        if diverged.any():
            envs = diverged.nonzero().flatten().tolist()
            time = self._state["time"][envs[0]].item()
            raise FloatingPointError(
                f"MuJoCo Warp simulation of env {', '.join(map(str, envs))} diverged (NaN/Inf in qpos or qvel) at time "
                f"{time:.3f} s; lower the timestep or the gains"
            )
        envs = (overflow != 0).nonzero().flatten().tolist()
        bits = int(overflow[envs[0]].item())
        settings = [f"nconmax={self.nconmax} (contacts)"] if bits & _TOO_MANY_CONTACTS else []
        settings += [f"njmax={self.njmax} (constraint rows)"] if bits & _TOO_MANY_ROWS else []
        raise RuntimeError(
            f"MuJoCo Warp overflowed its per-env buffers in env {', '.join(map(str, envs))} (overflow bits {bits:#x}): "
            f"raise MujocoWarpBackend's {' and '.join(settings) or 'nconmax and njmax'}; what did not fit was dropped"
        )

    def deepest_penetration(self) -> float:
        _, _, dist = self._contacts()
        return max(0.0, -float(dist.min())) if len(dist) else 0.0

    def forward(self, env_ids=None) -> None:
        chosen = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        if env_ids is not None:
            chosen.zero_()[self._ids(env_ids)] = True
        if bool(chosen.all()):
            self._launch(self._forward_graph)
            self._kept_contacts = None
            self._kept_envs.zero_()
            return
        env, pairs, dist = self._contacts()
        kept = ~chosen[env]
        self._kept_contacts = (env[kept], pairs[kept], dist[kept])
        with self._keeping_poses(~chosen):
            self._launch(self._forward_graph)
        self._kept_envs = ~chosen

    @contextlib.contextmanager
    def _keeping_poses(self, envs: torch.Tensor):
        """Restore what the queries read of `envs` ([E] bool) after a pass over every world."""
        saved = {name: view.clone() for name, view in self._poses.items()}
        yield
        for name, view in self._poses.items():
            keep = envs.view(-1, *([1] * (view.dim() - 1)))
            view.copy_(torch.where(keep, saved[name], view))

    def _contacts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every env's active contacts as (env [C], geom pairs [C, 2], distance [C]), long, long, float32."""
        c = self._contact
        count = c["count"][0].clamp(max=len(c["world"]))
        valid = (torch.arange(len(c["world"]), device=self.device) < count) & ((c["type"] & 1) != 0)
        env = c["world"].long()
        valid &= ~self._kept_envs[env.clamp(0, self.num_envs - 1)]
        env, pairs, dist = env[valid], c["geom"][valid].long(), c["dist"][valid]
        if self._kept_contacts is not None:
            kept_env, kept_pairs, kept_dist = self._kept_contacts
            env, pairs, dist = torch.cat([env, kept_env]), torch.cat([pairs, kept_pairs]), torch.cat([dist, kept_dist])
        return env, pairs, dist

    # -- physical parameters -----------------------------------------------------------------------
    @cache  # noqa: B019
    def _param_ids(self, param: str, names: tuple[str, ...]):
        """Where `param` of `names` lives: body, dof or actuator ids; for friction each body's colliding geoms; for
        body_size each body's (id, geoms, sites)."""
        kind, _ = check_physics_param(param, names)
        model = self.model
        if kind == "body":
            bodies = [self._named(mujoco.mjtObj.mjOBJ_BODY, n, "body") for n in names]
            if param == "body_mass" and (model.body_mass[bodies] <= 0).any():
                raise ValueError(f"body_mass: bodies {list(names)} include one without mass (the world?)")
            if param == "body_size":
                return [
                    (body, self._on(geoms), self._on(sites))
                    for body, geoms, sites in resizable_parts(model, names, bodies)
                ]
            if param != "friction":
                return torch.tensor(bodies, device=self.device)
            return [self._on(geoms) for geoms in colliding_geoms(model, names, bodies)]
        if kind == "joint":
            return self._joint_addr(names)[1]
        if kind == "actuator":
            acts = self._ids_of(mujoco.mjtObj.mjOBJ_ACTUATOR, names, "actuator").cpu().numpy()
            check_position_actuators(model, names, acts)
            return self._on(acts)
        return None  # gravity

    def physics(self, param, names):
        if param in VISUAL_PARAMS:
            return self._drawn_scene().physics(param, names).to(self.device)
        ids = self._param_ids(param, tuple(names))
        p = self._params
        if param == "body_mass":
            return p["body_mass"][:, ids].clone()
        if param == "body_com":
            return p["body_ipos"][:, ids].clone()
        if param == "body_size":
            return self._size[:, [body for body, _, _ in ids]].clone()
        if param == "friction":
            return torch.stack([p["geom_friction"][:, geoms, 0].amax(1) for geoms in ids], 1)
        if param == "joint_damping":
            return p["dof_damping"][:, ids].clone()
        if param == "joint_armature":
            return p["dof_armature"][:, ids].clone()
        if param == "joint_frictionloss":
            return p["dof_frictionloss"][:, ids].clone()
        if param == "actuator_gain":
            return p["actuator_gainprm"][:, ids, 0].clone()
        return p["gravity"][:, None].clone()

    def set_physics(self, param, env_ids, names, values):
        if param in VISUAL_PARAMS:
            self._drawn_scene().set_physics(param, env_ids, names, values)
            return
        ids = self._param_ids(param, tuple(names))
        values = self._in(check_physics_values(param, names, values, len(env_ids)))
        envs, p = self._ids(env_ids), self._params
        rows = envs[:, None]
        if param == "body_mass":
            p["body_inertia"][rows, ids] *= (values / p["body_mass"][rows, ids])[..., None]
            p["body_mass"][rows, ids] = values
        elif param == "body_com":
            p["body_ipos"][rows, ids] = values
        elif param == "body_size":
            self._resize(envs, ids, values)
            if self._scene is not None:
                self._scene.set_physics(param, env_ids, names, values.cpu())
        elif param == "friction":
            for k, geoms in enumerate(ids):
                friction = p["geom_friction"][rows, geoms, 0]
                p["geom_friction"][rows, geoms, 0] = friction * (values[:, k : k + 1] / friction.amax(1, keepdim=True))
        elif param == "joint_damping":
            p["dof_damping"][rows, ids] = values
        elif param == "joint_armature":
            p["dof_armature"][rows, ids] = values
        elif param == "joint_frictionloss":
            p["dof_frictionloss"][rows, ids] = values
        elif param == "actuator_gain":
            p["actuator_gainprm"][rows, ids, 0] = values
            p["actuator_biasprm"][rows, ids, 1] = -values
        else:
            p["gravity"][envs] = values[:, 0]
        if param in _NEEDS_SET_CONST:
            self._set_const(envs)

    def _resize(self, envs: torch.Tensor, resized, values: torch.Tensor) -> None:
        """Scale each body's shapes to `values` times nominal, keeping its mass and the centre-of-mass offset that
        body_com added (as the MuJoCo backend): positions in the body scale, so do the bounding volumes."""
        p, nominal, rows = self._params, self._nominal, envs[:, None]
        for k, (body, geoms, sites) in enumerate(resized):
            size = values[:, k]
            ratio = size / self._size[envs, body]
            grow = size[:, None, None]
            for field in ("geom_size", "geom_pos", "geom_aabb"):
                p[field][rows, geoms] = nominal[field][geoms] * (grow[..., None] if field == "geom_aabb" else grow)
            p["geom_rbound"][rows, geoms] = nominal["geom_rbound"][geoms] * size[:, None]
            p["site_pos"][rows, sites] = nominal["site_pos"][sites] * grow
            offset = p["body_ipos"][envs, body] - nominal["body_ipos"][body] * self._size[envs, body][:, None]
            p["body_ipos"][envs, body] = nominal["body_ipos"][body] * size[:, None] + offset
            p["body_inertia"][envs, body] *= (ratio**2)[:, None]
            self._size[envs, body] = size

    def _set_const(self, envs: torch.Tensor) -> None:
        """Recompute the constants MuJoCo derives from masses, centres of mass and armatures for `envs`. set_const
        runs on every world and moves every world's poses to its current state: the other worlds' constants (float32
        recomputations) and every world's poses are put back, so only `envs`' model changes."""
        others = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        others[envs] = False
        derived = (*_DERIVED, "meaninertia")
        saved = {name: self._params[name].clone() for name in derived}
        with self._keeping_poses(torch.ones_like(others)), self._on_device():
            self.mjw.set_const(self.m, self.d)
        for name in derived:
            view = self._params[name]
            view.copy_(torch.where(others.view(-1, *([1] * (view.dim() - 1))), saved[name], view))

    def joint_bodies(self, joints):
        return joint_bodies(self.model, joints)

    def free_bodies(self):
        return free_bodies(self.model)

    def lights(self):
        return light_names(self.model)

    # -- kinematics ------------------------------------------------------------------------------
    @cache  # noqa: B019
    def _site(self, site: str) -> int:
        return self._named(mujoco.mjtObj.mjOBJ_SITE, site, "site")

    def site_pose(self, site):
        sid = self._site(site)
        return self._poses["site_xpos"][:, sid].clone(), _mat_to_quat(self._poses["site_xmat"][:, sid])

    def body_pose(self, body):
        bid = self._named(mujoco.mjtObj.mjOBJ_BODY, body, "body")
        return self._poses["xpos"][:, bid].clone(), self._poses["xquat"][:, bid].clone()

    @cache  # noqa: B019
    def _jacobian_columns(self, site: str, joints: tuple[str, ...]) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """(site id, its tree's root body, the joints' dofs, which of them move the site) as mj_jac walks them."""
        sid, model = self._site(site), self.model
        _, dofs = self._joint_addr(joints)
        body = int(model.site_bodyid[sid])
        while body > 0 and model.body_dofnum[body] == 0:
            body = int(model.body_parentid[body])
        chain: set[int] = set()
        dof = int(model.body_dofadr[body] + model.body_dofnum[body] - 1) if body > 0 else -1
        while dof >= 0:
            chain.add(dof)
            dof = int(model.dof_parentid[dof])
        moves = torch.tensor([d in chain for d in dofs.tolist()], dtype=torch.float32, device=self.device)
        return sid, int(model.body_rootid[model.site_bodyid[sid]]), dofs, moves

    def site_jacobian(self, site, joints):
        sid, root, dofs, moves = self._jacobian_columns(site, tuple(joints))
        cdof = self._poses["cdof"][:, dofs]  # [E, k, 6]: rotation axis, then translation
        rotation, translation = cdof[..., :3], cdof[..., 3:]
        offset = (self._poses["site_xpos"][:, sid] - self._poses["subtree_com"][:, root])[:, None]
        linear = translation + torch.linalg.cross(rotation, offset.expand_as(rotation))
        return (torch.cat([linear, rotation], -1) * moves[:, None]).transpose(1, 2).contiguous()

    @cache  # noqa: B019
    def _geom_mask(self, geoms: tuple[str, ...]) -> torch.Tensor:
        mask = torch.zeros(self.model.ngeom, dtype=torch.bool, device=self.device)
        mask[self._ids_of(mujoco.mjtObj.mjOBJ_GEOM, geoms, "geom")] = True
        return mask

    def in_contact(self, geoms_a, geoms_b):
        in_a, in_b = self._geom_mask(tuple(geoms_a)), self._geom_mask(tuple(geoms_b))
        env, pairs, _ = self._contacts()
        g1, g2 = pairs[:, 0].clamp(min=0), pairs[:, 1].clamp(min=0)
        touching = (in_a[g1] & in_b[g2]) | (in_b[g1] & in_a[g2])
        out = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        out[env[touching]] = True
        return out

    # -- frames ----------------------------------------------------------------------------------
    def _drawn_scene(self) -> MujocoBackend:
        """The C MuJoCo copy of the scene frames are drawn in: per-env models for the camera, light and colour
        parameters and the resized bodies, per-env MjData that receive each env's poses."""
        if self._scene is None:
            self._scene = MujocoBackend(self.xml, self.num_envs, physics_dt=self.physics_dt)
            resized = [b for b in range(self.model.nbody) if bool((self._size[:, b] != 1).any())]
            if resized:  # the sizes written before the first frame
                names = [self.model.body(b).name for b in resized]
                self._scene.set_physics("body_size", torch.arange(self.num_envs), names, self._size[:, resized].cpu())
        return self._scene

    def render(self, camera, width, height):
        scene = self._drawn_scene()
        poses = {name: self._poses[name].cpu().double().numpy() for name in _POSES if name != "cdof"}
        qpos = self._state["qpos"].cpu().double().numpy()
        mocap_pos, mocap_quat = self._mocap_pos.cpu().double().numpy(), self._mocap_quat.cpu().double().numpy()
        for k, (model, data) in enumerate(zip(scene.models, scene.datas, strict=True)):
            data.qpos[:] = qpos[k]
            data.mocap_pos[:], data.mocap_quat[:] = mocap_pos[k], mocap_quat[k]
            for name, values in poses.items():
                getattr(data, name)[:] = values[k].reshape(getattr(data, name).shape)
            mujoco.mj_camlight(model, data)  # cameras and lights from the poses, with each env's own camera params
        return scene.render(camera, width, height).to(self.device)

    def close(self) -> None:
        if self._scene is not None:
            self._scene.close()
            self._scene = None
        self._graphs.clear()
