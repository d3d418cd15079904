"""SimBackend on Genesis: one scene built with `n_envs` parallel copies, torch in and out.

The task's MJCF is read with MuJoCo's own compiler (includes, defaults) and split into one Genesis
entity per top-level body: Genesis applies gravity compensation per entity, not per body as MJCF's
`gravcomp` does, so the arm (gravcomp 1) and a free cube (gravcomp 0) must be separate entities.
Mocap bodies become fixed entities whose base pose is set per env. World geoms (the floor) go with the
first articulated entity. Position actuators keep their MJCF gains (Genesis reads kp, kv and the force
range of a `<position>` actuator) and take joint targets through Genesis's PD control. Genesis applies MJCF
contact excludes and contype/conaffinity only within one entity, so after the build the geom pairs MuJoCo
never collides are cut from its collider's pair table; geoms are matched to MuJoCo's by body and order.

Genesis is imported lazily: `pip install -e ".[genesis]"` provides it. It runs on its CPU backend, or
on CUDA when torch sees a GPU; state is returned on that device (`self.device`), where the task computes.
Not carried over (yet): rendering (pixel observations, videos), MuJoCo's contacts after a state set without a
step (`in_contact` reports the last step's contacts), per-body gravcomp within one tree, equality constraints
other than welds between top-level bodies.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import mujoco
import numpy as np
import torch
from robotrl.tasks.backend import VISUAL_PARAMS, SimBackend, check_physics_param, check_physics_values
from robotrl.tasks.scene_names import free_bodies, joint_bodies, light_names

from robotrl.core.rotations import quat_multiply, quat_to_matrix

INSTALL_HINT = 'the genesis extra: pip install -e ".[genesis]"'


def import_genesis():
    try:
        import genesis as gs
    except ImportError as err:
        raise ImportError(
            f"task.backend=genesis needs genesis-world, which is not installed; install {INSTALL_HINT}"
        ) from err
    if not gs._initialized:
        backend = gs.cuda if torch.cuda.is_available() else gs.cpu
        gs.init(backend=backend, precision="32", logging_level="warning")
    return gs


def _split_scene(xml: Path) -> tuple[mujoco.MjModel, list[tuple], list[tuple[str, str, np.ndarray]]]:
    """The compiled whole scene; (top-level body, kind, gravity compensation, MJCF text, pose) per entity; and the
    welds between bodies of different entities as (body1, body2, pose of body2 in body1's frame [7]).

    A mocap body's part is authored at the origin and placed by the entity's pose, so that moving the entity's
    base (Genesis's `set_pos`) moves the body itself."""
    spec = mujoco.MjSpec.from_file(str(xml))
    model = spec.compile()
    # MuJoCo starts an inactive equality off and no backend call turns it on; Genesis's MJCF parser would apply it.
    for equality in list(spec.equalities):
        if not equality.active:
            spec.delete(equality)
    welds = []
    for e in range(model.neq):
        if not model.eq_active0[e] or int(model.eq_objtype[e]) != int(mujoco.mjtObj.mjOBJ_BODY):
            continue  # joint couplings live inside one tree
        a, b = int(model.eq_obj1id[e]), int(model.eq_obj2id[e])
        if model.body_rootid[a] == model.body_rootid[b]:
            continue
        if int(model.eq_type[e]) != int(mujoco.mjtEq.mjEQ_WELD) or a == 0 or b == 0:
            raise ValueError(
                f"{xml.name}: equality {e} couples two top-level bodies (or the world) with a constraint the "
                "genesis backend cannot carry between entities (it carries welds between two bodies)"
            )
        welds.append((model.body(a).name, model.body(b).name, np.array(model.eq_data[e][3:10])))
    tops = list(spec.worldbody.bodies)
    holder = next((b.name for b in tops if not b.mocap and not b.joints), tops[0].name)  # keeps the floor
    entities = []
    for top in tops:
        free = any(j.type == mujoco.mjtJoint.mjJNT_FREE for j in top.joints)
        kind = "mocap" if top.mocap else ("free" if free else "tree")
        part = spec.copy()
        for other in list(part.worldbody.bodies):
            if other.name != top.name:
                part.delete(other)
        pose = None
        if kind == "mocap":
            body = part.body(top.name)
            pose = (tuple(float(v) for v in top.pos), tuple(float(v) for v in top.quat))
            body.pos, body.quat = [0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]
        if top.name != holder:
            for geom in list(part.worldbody.geoms):
                part.delete(geom)
        root = model.body(top.name).id
        subtree = [b for b in range(model.nbody) if model.body_rootid[b] == root]
        movable = {float(model.body_gravcomp[b]) for b in subtree if model.body_dofnum[b] > 0}
        if len(movable) > 1:
            raise ValueError(
                f"body tree {top.name!r} mixes gravcomp values {sorted(movable)}: the genesis backend applies gravity "
                "compensation per top-level body (one Genesis entity), not per body"
            )
        entities.append((top.name, kind, movable.pop() if movable else 0.0, part.to_xml(), pose))
    return model, entities, welds


class GenesisBackend(SimBackend):
    uniform_params = frozenset({"body_size"})  # a batched scene builds each body's geometry once, for all envs

    def __init__(self, xml: str | Path, num_envs: int = 1, pixels: bool = False, physics_dt: float | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if pixels:
            raise NotImplementedError(
                "pixel observations (task.obs=pixels or state+pixels) are not available on the genesis backend: "
                "Genesis's rasterizer (headless here, about 0.4 s a frame on the CPU) draws one view of the whole "
                "batch, per-env camera images need its CUDA batch renderer (gs-madrona), which this backend does not "
                "drive yet; use task.backend=mujoco"
            )
        gs = import_genesis()
        self.gs = gs
        self.device = torch.device(gs.device)  # state stays there: the task's per-step math runs beside it
        self.model, parts, welds = _split_scene(Path(xml))
        self.num_envs = num_envs
        if physics_dt is not None:
            self.model.opt.timestep = physics_dt  # what the scene's dt and the model's consumers read
        self.physics_dt = float(self.model.opt.timestep)
        integrator = {
            int(mujoco.mjtIntegrator.mjINT_EULER): gs.integrator.Euler,
            int(mujoco.mjtIntegrator.mjINT_IMPLICITFAST): gs.integrator.implicitfast,
        }.get(int(self.model.opt.integrator))
        if integrator is None:
            raise ValueError(f"{Path(xml).name}: the genesis backend supports the Euler and implicitfast integrators")
        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=self.physics_dt, substeps=1),
            rigid_options=gs.options.RigidOptions(
                integrator=integrator,
                enable_torsional_friction=bool((self.model.geom_condim >= 4).any()),
                enable_self_collision=True,
                # Genesis drops self-collision pairs that overlap at qpos0 (the Panda's link5 and hand); tasks reset
                # away from qpos0 and MuJoCo keeps those pairs.
                enable_neutral_collision=True,
                # per-env masses, centres of mass and joint properties (set_physics); always on, so the scenes of
                # randomized and nominal runs share one set of compiled kernels
                batch_links_info=True,
                batch_dofs_info=True,
            ),
            show_viewer=False,
        )
        self.entities, self._mocap = {}, {}
        for name, kind, gravcomp, text, pose in parts:
            material = gs.materials.Rigid(gravity_compensation=gravcomp)
            # a mocap body is placed per env; with collision geometry (a fixture) its vertices must be per env too
            placed = {} if pose is None else {"pos": pose[0], "quat": pose[1], "batch_fixed_verts": True}
            if kind == "free":
                # Genesis moves a loose object's frame onto its centre of mass unless told not to, and then refuses
                # to write the centre of mass; MuJoCo's body frame is the authored one
                placed["align"] = False
            entity = self.scene.add_entity(gs.morphs.MJCF(file=text, **placed), material=material)
            self.entities[name] = entity
            if kind == "mocap":
                self._mocap[name] = entity
        self.scene.build(n_envs=num_envs)
        self._gravity = torch.tensor(self.model.opt.gravity, dtype=torch.float32, device=self.device).repeat(
            num_envs, 1
        )
        self._mj_geom = self._match_collision_geoms()
        self._drop_pairs_mujoco_never_collides()
        # MuJoCo starts every actuator at ctrl = 0 (a position actuator holds its joint at 0: the gripper closed);
        # Genesis starts with no control at all, so give the position actuators MuJoCo's initial targets.
        names = [self.model.actuator(i).name for i in range(self.model.nu)]
        if names:
            self.set_actuators(names, torch.zeros(num_envs, len(names)))
        # A weld between entities: put body2 where the weld holds it (MJCF relpose; without one, where it is at qpos0,
        # which the scene starts in), then weld the current pose.
        self.forward()
        everyone = torch.arange(num_envs)
        for body1, body2, relpose in welds:
            if relpose[3:].any():
                pos, quat = self.body_pose(body1)
                offset, turn = (
                    torch.tensor(v, dtype=torch.float32, device=self.device) for v in (relpose[:3], relpose[3:])
                )
                self.set_free_body_pose(
                    everyone,
                    body2,
                    pos + (quat_to_matrix(quat) @ offset.unsqueeze(-1)).squeeze(-1),
                    quat_multiply(quat, turn.expand_as(quat)),
                )
            # body2 first: Genesis anchors a weld at its first link's origin, MuJoCo at body2's (MJCF's default
            # anchor). Anchored at the hand, the peg 12 cm away drifted 1 cm and 0.08 rad under random actions.
            self.scene.sim.rigid_solver.add_weld_constraint(
                self._link(body2)[1].idx, self._link(body1)[1].idx, envs_idx=self._ids(everyone)
            )

    def _match_collision_geoms(self) -> np.ndarray:
        """MuJoCo's geom id of each Genesis collision geom, matched by body and order among the body's colliding
        geoms (Genesis's geom names are not reliable: it calls hand4's middle_tip and ring_tip "index_tip")."""
        model = self.model
        colliding = np.flatnonzero((model.geom_contype | model.geom_conaffinity) != 0)
        mujoco_geoms: dict[str, list[int]] = {}
        for g in colliding:
            mujoco_geoms.setdefault(model.body(int(model.geom_bodyid[g])).name, []).append(int(g))
        genesis_geoms: dict[str, list[int]] = {}
        for i, geom in enumerate(self.scene.sim.rigid_solver.geoms):
            genesis_geoms.setdefault(geom.link.name, []).append(i)
        differ = sorted(
            body
            for body in mujoco_geoms.keys() | genesis_geoms.keys()
            if len(mujoco_geoms.get(body, ())) != len(genesis_geoms.get(body, ()))
        )
        if differ:
            raise ValueError(
                f"bodies {differ} have a different number of collision geoms on the genesis backend than in the MJCF "
                "(a mesh split into convex pieces?): the backend matches geoms to MuJoCo's by body and order"
            )
        out = np.empty(len(self.scene.sim.rigid_solver.geoms), dtype=np.int64)
        for body, geoms in genesis_geoms.items():
            out[geoms] = mujoco_geoms[body]
        return out

    def _drop_pairs_mujoco_never_collides(self) -> None:
        """Remove from Genesis's collider the geom pairs MuJoCo never collides: `<contact><exclude>` bodies and
        contype/conaffinity that do not match. Genesis honours both only within one entity (an MJCF entity's masks
        are local to it), so across the split scene's entities they would collide. The pairs are cut from the
        collider's candidate pair table after the build, as Genesis's own build leaves out welded pairs."""
        model, geoms = self.model, self._mj_geom
        excluded = np.zeros((model.nbody, model.nbody), dtype=bool)
        for signature in model.exclude_signature:
            a, b = int(signature) >> 16, int(signature) & 0xFFFF
            excluded[a, b] = excluded[b, a] = True
        body, contype, conaffinity = model.geom_bodyid[geoms], model.geom_contype[geoms], model.geom_conaffinity[geoms]
        masks_match = (contype[:, None] & conaffinity[None, :]) | (contype[None, :] & conaffinity[:, None])
        never = excluded[body[:, None], body[None, :]] | (masks_match == 0)
        try:
            table = self.scene.sim.rigid_solver.collider.collider_info.collision_pair_idx
        except AttributeError as err:
            raise RuntimeError(
                "the genesis backend drops MJCF contact excludes from Genesis's collider pair table "
                "(collider_info.collision_pair_idx, genesis-world 1.4.5), which this Genesis lacks"
            ) from err
        pairs = table.to_numpy()
        n = len(geoms)
        pairs[:n, :n][never] = -1
        table.from_numpy(pairs)

    # -- name lookups ----------------------------------------------------------------------------
    @cache  # noqa: B019  (the backend lives as long as its env)
    def _joints(self, joints: tuple[str, ...]) -> list[tuple[object, list[int], list[int]]]:
        """Group `joints` by entity: (entity, local dof indices, positions in `joints`)."""
        groups: dict[int, tuple[object, list[int], list[int]]] = {}
        for k, name in enumerate(joints):
            found = None
            for entity in self.entities.values():
                try:
                    found = entity, entity.get_joint(name)
                    break
                except Exception:
                    continue
            if found is None:
                raise KeyError(f"joint {name!r} is not in the scene")
            entity, joint = found
            if joint.n_dofs != 1:
                raise ValueError(f"joint {name!r} is not a hinge or slide joint")
            group = groups.setdefault(id(entity), (entity, [], []))
            group[1].append(int(joint.dofs_idx_local[0]))
            group[2].append(k)
        return list(groups.values())

    @cache  # noqa: B019
    def _link(self, body: str):
        for entity in self.entities.values():
            try:
                return entity, entity.get_link(body)
            except Exception:
                continue
        raise KeyError(f"body {body!r} is not in the scene")

    def _named(self, kind, name: str, what: str) -> int:
        idx = mujoco.mj_name2id(self.model, kind, name)
        if idx < 0:
            raise KeyError(f"{what} {name!r} is not in model")
        return idx

    @cache  # noqa: B019
    def _actuated(self, actuators: tuple[str, ...]) -> tuple[str, ...]:
        names = []
        for name in actuators:
            act = self._named(mujoco.mjtObj.mjOBJ_ACTUATOR, name, "actuator")
            position = self.model.actuator_biasprm[act, 1] == -self.model.actuator_gainprm[act, 0] != 0
            if int(self.model.actuator_trntype[act]) != int(mujoco.mjtTrn.mjTRN_JOINT) or not position:
                raise ValueError(f"actuator {name!r}: the genesis backend drives joint position actuators only")
            names.append(self.model.joint(int(self.model.actuator_trnid[act, 0])).name)
        return tuple(names)

    @staticmethod
    def _out(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(torch.float32).clone()

    def _ids(self, env_ids: torch.Tensor) -> torch.Tensor:
        return env_ids.to(self.gs.device, torch.long)

    def _in(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(self.gs.device, self.gs.tc_float)

    # -- state -----------------------------------------------------------------------------------
    def _gather(self, joints, getter: str) -> torch.Tensor:
        out = torch.empty(self.num_envs, len(joints), device=self.device)
        for entity, dofs, cols in self._joints(tuple(joints)):
            out[:, cols] = self._out(getattr(entity, getter)(dofs))
        return out

    def joint_pos(self, joints: Sequence[str]) -> torch.Tensor:
        return self._gather(joints, "get_dofs_position")

    def joint_vel(self, joints: Sequence[str]) -> torch.Tensor:
        return self._gather(joints, "get_dofs_velocity")

    def set_joint_state(self, env_ids, joints, pos, vel=None) -> None:
        ids = self._ids(env_ids)
        vel = torch.zeros_like(pos) if vel is None else vel
        for entity, dofs, cols in self._joints(tuple(joints)):
            entity.set_dofs_position(self._in(pos[:, cols]), dofs, ids, zero_velocity=False)
            entity.set_dofs_velocity(self._in(vel[:, cols]), dofs, ids)

    def set_free_body_pose(self, env_ids, body, pos, quat) -> None:
        entity, link = self._link(body)
        if not link.joints or link.joints[0].type != self.gs.JOINT_TYPE.FREE:
            raise ValueError(f"body {body!r} has no free joint")
        ids = self._ids(env_ids)
        entity.set_pos(self._in(pos), ids, zero_velocity=True)
        entity.set_quat(self._in(quat), ids, zero_velocity=True)

    def set_mocap_pose(self, env_ids, body, pos, quat=None) -> None:
        entity = self._mocap.get(body)
        if entity is None:
            raise ValueError(f"body {body!r} is not a mocap body")
        ids = self._ids(env_ids)
        entity.set_pos(self._in(pos), ids)
        if quat is not None:
            entity.set_quat(self._in(quat), ids)

    def set_actuators(self, actuators, values) -> None:
        joints = self._actuated(tuple(actuators))
        for entity, dofs, cols in self._joints(joints):
            entity.control_dofs_position(self._in(values[:, cols]), dofs)

    def step(self, substeps: int) -> None:
        for _ in range(substeps):
            self.scene.step()

    def forward(self, env_ids=None) -> None:
        pass  # Genesis updates poses when a state is set

    # -- physical parameters -----------------------------------------------------------------------
    @cache  # noqa: B019
    def _param_ids(self, param: str, names: tuple[str, ...]):
        """Genesis's indices for `param` of `names`: link, dof or (friction) geom indices with each geom's body
        column and its nominal friction."""
        kind, _ = check_physics_param(param, names)
        if param in VISUAL_PARAMS:
            raise ValueError(
                f"{param} changes what a camera sees; the genesis backend does not render yet (use task.backend=mujoco "
                "for pixel observations and camera randomization)"
            )
        if kind == "body":
            links = [self._link(name)[1].idx for name in names]
            if param != "friction":
                return torch.tensor(links, device=self.gs.device)
            model = self.model
            geoms, columns = [], []
            for k, name in enumerate(names):
                body = self._named(mujoco.mjtObj.mjOBJ_BODY, name, "body")
                own = [i for i, g in enumerate(self._mj_geom) if model.geom_bodyid[g] == body]
                if not own:
                    raise ValueError(f"friction: body {name!r} has no colliding geom")
                geoms += own
                columns += [k] * len(own)
            solver = self.scene.sim.rigid_solver
            nominal = self._out(solver.get_geoms_friction(geoms)).to(self.device)
            columns = torch.tensor(columns, device=self.device)
            # each body's largest nominal friction, per geom: a write scales all of a body's geoms alike
            body_max = torch.zeros(len(names), device=self.device).scatter_reduce(0, columns, nominal, "amax")
            return geoms, columns, nominal, body_max[columns]
        if kind == "joint":
            dofs = []
            for entity, local, _ in self._joints(names):
                dofs += [entity.dof_start + d for d in local]
            order = [k for _, _, cols in self._joints(names) for k in cols]
            by_name = [dofs[order.index(k)] for k in range(len(names))]
            return torch.tensor(by_name, device=self.gs.device)
        if kind == "actuator":
            return self._param_ids("joint_damping", self._actuated(names))
        return None  # gravity

    def physics(self, param, names):
        ids = self._param_ids(param, tuple(names))
        solver = self.scene.sim.rigid_solver
        if param == "body_mass":
            return self._out(solver.get_links_mass(ids)).to(self.device)
        if param == "body_com":
            return self._out(solver.get_links_COM(ids)).to(self.device)
        if param == "friction":
            geoms, columns, nominal, _ = ids
            friction = nominal * self._out(solver.get_geoms_friction_ratio(geoms)).to(self.device)
            out = torch.zeros(self.num_envs, len(names), device=self.device)
            return out.scatter_reduce(1, columns.expand_as(friction), friction, "amax")
        if param == "gravity":
            return self._gravity.clone().unsqueeze(1)
        if param == "body_size":
            return torch.ones(self.num_envs, len(names), device=self.device)  # only ever nominal: set_physics
        getter = {
            "joint_damping": solver.get_dofs_damping,
            "joint_armature": solver.get_dofs_armature,
            "joint_frictionloss": solver.get_dofs_frictionloss,
            "actuator_gain": solver.get_dofs_kp,
        }[param]
        return self._out(getter(ids)).to(self.device)

    def set_physics(self, param, env_ids, names, values):
        ids = self._param_ids(param, tuple(names))
        values = self._in(check_physics_values(param, names, values, len(env_ids)))
        envs = self._ids(env_ids)
        solver = self.scene.sim.rigid_solver
        if param == "body_mass":
            solver.set_links_mass(values, ids, envs, scale_inertia=True)
        elif param == "body_com":
            solver.set_links_COM(values, ids, envs)
        elif param == "friction":
            geoms, columns, _, body_max = ids
            solver.set_geoms_friction_ratio(values[:, columns.to(values.device)] / self._in(body_max), geoms, envs)
        elif param == "body_size":
            if not bool((values == 1).all()):
                raise ValueError(
                    f"body_size of {list(names)}: the genesis backend builds one geometry per body for "
                    "all envs, so an object's size stays nominal (uniform_params)"
                )
        elif param == "gravity":
            self.scene.sim.set_gravity(values[:, 0], envs)
            self._gravity[env_ids.to(self.device)] = values[:, 0].to(self.device, torch.float32)
        else:
            setter = {
                "joint_damping": solver.set_dofs_damping,
                "joint_armature": solver.set_dofs_armature,
                "joint_frictionloss": solver.set_dofs_frictionloss,
                "actuator_gain": solver.set_dofs_kp,
            }[param]
            setter(values, ids, envs)

    def joint_bodies(self, joints):
        return joint_bodies(self.model, joints)

    def lights(self):
        return light_names(self.model)

    def free_bodies(self):
        return free_bodies(self.model)

    # -- kinematics ------------------------------------------------------------------------------
    def body_pose(self, body):
        _, link = self._link(body)
        return self._out(link.get_pos()), self._out(link.get_quat())

    @cache  # noqa: B019
    def _site(self, site: str) -> tuple[str, torch.Tensor, torch.Tensor]:
        sid = self._named(mujoco.mjtObj.mjOBJ_SITE, site, "site")
        body = self.model.body(int(self.model.site_bodyid[sid])).name
        pos = torch.tensor(self.model.site_pos[sid], dtype=torch.float32, device=self.device)
        quat = torch.tensor(self.model.site_quat[sid], dtype=torch.float32, device=self.device)
        return body, pos, quat

    def site_pose(self, site):
        body, offset, rot = self._site(site)
        pos, quat = self.body_pose(body)
        world = pos + (quat_to_matrix(quat) @ offset.unsqueeze(-1)).squeeze(-1)
        return world, quat_multiply(quat, rot.expand_as(quat))

    def site_jacobian(self, site, joints):
        body, offset, _ = self._site(site)
        entity, link = self._link(body)
        groups = self._joints(tuple(joints))
        out = torch.zeros(self.num_envs, 6, len(joints), device=self.device)
        for group_entity, dofs, cols in groups:
            if group_entity is entity:
                jac = self._out(entity.get_jacobian(link, local_point=offset))
                out[:, :, cols] = jac[:, :, dofs]
        return out

    @cache  # noqa: B019
    def _geom_mask(self, geoms: tuple[str, ...]) -> torch.Tensor:
        ids = [self._named(mujoco.mjtObj.mjOBJ_GEOM, g, "geom") for g in geoms]  # checks each name
        missing = [name for name, i in zip(geoms, ids, strict=True) if i not in self._mj_geom]
        if missing:
            raise KeyError(f"geoms {missing} have no collision geometry on the genesis backend")
        return torch.from_numpy(np.isin(self._mj_geom, ids)).to(self.device)

    def in_contact(self, geoms_a, geoms_b):
        in_a, in_b = self._geom_mask(tuple(geoms_a)), self._geom_mask(tuple(geoms_b))
        collider = self.scene.sim.rigid_solver.collider
        contacts = collider.get_contacts(as_tensor=True, to_torch=True)
        ga, gb = contacts["geom_a"].to(self.device, torch.long), contacts["geom_b"].to(self.device, torch.long)
        valid = (
            contacts["valid_mask"].to(self.device, torch.bool)
            if "valid_mask" in contacts
            else torch.ones_like(ga, dtype=torch.bool)
        )
        ga, gb = ga.clamp(min=0), gb.clamp(min=0)
        touching = ((in_a[ga] & in_b[gb]) | (in_b[ga] & in_a[gb])) & valid
        return touching.reshape(self.num_envs, -1).any(-1)

    def render(self, camera, width, height):
        raise NotImplementedError(
            "rendering (videos, pixel observations) is not available on the genesis backend yet: its cameras must be "
            "added before the scene is built and per-env images need Genesis's CUDA batch renderer; use "
            "task.backend=mujoco for videos"
        )

    def close(self) -> None:
        self.scene = None
