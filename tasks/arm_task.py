"""Simulated arm tasks written once against SimBackend, and the VecEnv that runs them.

A task owns a backend, a robot spec and a controller; it resets chosen envs, turns actions into
actuator targets, and reports observations, rewards and success. `TaskVecEnv` adds what every task
shares: action validation, the control-rate loop, time limits and automatic resets.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from robotrl.tasks.backend import SimBackend
from robotrl.tasks.configs import BACKENDS, ArmTaskConfig
from robotrl.tasks.controllers import ArmController
from robotrl.tasks.expert import Expert
from robotrl.tasks.memory import check_num_envs_fits

from robotrl.core.camera_crop import check_camera_crops, crop_and_resize, render_size
from robotrl.core.deploy_spec import DeploySpec, ObsEntry
from robotrl.core.env import Obs, StepResult, check_action
from robotrl.core.model_overlay import load_overlay
from robotrl.core.robot_spec import RobotSpec, load_robot_spec
from robotrl.core.rotations import quat_to_matrix
from robotrl.core.spec import TensorSpec

ASSETS = Path(__file__).resolve().parent / "assets"
REST_TOLERANCE = 0.015  # m: an object's centre this close to its resting height is on the table
OBS_MODES = ("state", "pixels", "state+pixels")
SIM_TIMESTEP = 0.002  # s: the scenes' physics step (<option timestep> of assets/panda.xml and hand4.xml)
MAX_RENDER_SIZE = 480  # px: the largest square render of a cropped camera (assets/scene.xml's offscreen 640x480)


def make_backend(
    kind: str, xml: Path, num_envs: int, threads: int = 1, pixels: bool = False, physics_dt: float | None = None
) -> SimBackend:
    """`pixels`: the task renders observations, which a backend without a renderer refuses at start-up. A
    `num_envs` the machine cannot hold fails first, with the memory it would need (robotrl/tasks/memory.py).
    `physics_dt`: seconds per physics step, over the scene's own."""
    if kind not in BACKENDS:
        raise ValueError(f"task.backend must be one of {', '.join(BACKENDS)}, got {kind!r}")
    check_num_envs_fits(kind, xml, num_envs)
    if kind == "mujoco":
        # lazy (start-up time): MuJoCo loads when a task is built, so a task's spec and score need no simulator
        from robotrl.tasks.mujoco_backend import MujocoBackend

        return MujocoBackend(xml, num_envs, threads, physics_dt)
    if kind == "genesis":
        from robotrl.tasks.genesis_backend import GenesisBackend  # lazy: the optional extra genesis

        return GenesisBackend(xml, num_envs, pixels=pixels, physics_dt=physics_dt)
    if kind == "mujoco_warp":
        from robotrl.tasks.warp_backend import MujocoWarpBackend  # lazy: the optional extra warp

        return MujocoWarpBackend(xml, num_envs, physics_dt=physics_dt)
    raise AssertionError(kind)


class ArmTask(ABC):
    robot_name = "panda"
    scene: str
    default_episode_steps = 50
    default_control = "ee_delta"
    has_gripper = False  # tasks that use the gripper add one action: -1 fully open, +1 closed
    tool_orientation: torch.Tensor | None = None  # world quaternion to hold; None: the episode's start one
    # sites fixed to the tool (a peg held in the hand): their observation entries follow the tool rigidly, so a
    # robot computes them by forward kinematics (the deploy spec carries the offsets, `measure_held_offsets`)
    held_sites: tuple[str, ...] = ()
    # Objects put back between episodes: name -> (low, high) of its start position (or its first coordinates),
    # the box reset_scene draws it from, resting on the table. A robot env waits at reset for them to be there
    # (a person resets the scene), so no robot episode starts from a layout simulation never showed the policy.
    start_regions: ClassVar[dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
    # Goals reset_scene draws per episode with draw_goals; a robot env draws its episodes' goals the same way
    drawn_goals: tuple[str, ...] = ()
    # loose objects whose size may change per env (randomization's body_size): the task re-reads their sizes at
    # each reset to place them and judge success; an object whose size is the task (a peg in its hole) is not here
    resizable_objects: ClassVar[tuple[str, ...]] = ()
    # The fewest physics steps per 40 ms control step (each 40 ms / n long) at which the scripted expert still
    # succeeds and contacts sink at most 1 mm deeper on average than at the default 20 (bench/substeps.py,
    # bench/results/substeps.jsonl line 1): a run that wants speed sets task.control_substeps=n
    # task.physics_dt=0.04/n. 20: not measured lower (no scripted expert).
    fewest_substeps: ClassVar[int] = 20
    # The task's scripted expert (tasks/expert.py), a function of observation entries so it drives a robot too;
    # None: the task has none
    expert_class: ClassVar[type[Expert] | None] = None

    def __init__(self, cfg: ArmTaskConfig, num_envs: int):
        if cfg.reward not in ("dense", "sparse"):
            raise ValueError(f"task.reward must be dense or sparse, got {cfg.reward!r}")
        if cfg.control_substeps < 1:
            raise ValueError(f"task.control_substeps must be >= 1, got {cfg.control_substeps}")
        if cfg.physics_dt is not None and not (
            isinstance(cfg.physics_dt, (int, float)) and math.isfinite(cfg.physics_dt) and 0 < cfg.physics_dt <= 0.02
        ):
            raise ValueError(f"task.physics_dt must be a number in (0, 0.02] seconds or null, got {cfg.physics_dt!r}")
        if cfg.episode_steps is not None and cfg.episode_steps < 1:
            raise ValueError(f"task.episode_steps must be >= 1, got {cfg.episode_steps}")
        for name in ("max_ee_step", "max_joint_step", "success_threshold"):
            value = getattr(cfg, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"task.{name} must be a finite number > 0, got {value!r}")
        for name in ("render_width", "render_height"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"task.{name} must be >= 1, got {getattr(cfg, name)}")
        control = cfg.control or self.default_control
        if cfg.relative_frame and control != "ee_delta":
            raise ValueError(f"task.relative_frame=true rotates ee_delta actions; task.control is {control}")
        if cfg.obs not in OBS_MODES:
            raise ValueError(f"task.obs must be one of {', '.join(OBS_MODES)}, got {cfg.obs!r}")
        if cfg.obs != "state":
            if not 64 <= cfg.image_size <= 128:
                raise ValueError(f"task.image_size must be within 64..128, got {cfg.image_size}")
            if not cfg.cameras:
                raise ValueError(f"task.obs={cfg.obs} needs at least one camera in task.cameras")
        # camera -> (top, bottom, left, right): the region each pixel observation shows (TaskVecEnv._observe)
        self.camera_crops = check_camera_crops(cfg.camera_crops, list(cfg.cameras), "task.camera_crops")
        self.cfg = cfg
        self.episode_steps = cfg.episode_steps or self.default_episode_steps
        self.num_envs = num_envs
        self.robot = load_robot_spec(self.robot_name)
        self.backend = make_backend(
            cfg.backend, ASSETS / self.scene, num_envs, cfg.sim_threads, cfg.obs != "state", cfg.physics_dt
        )
        self.device = self.backend.device  # where the state lives, and so the task's per-step math
        self.robot = self.robot.to(self.device)
        # the identified robot, written over the nominal model (its latency is the actuator model's to apply)
        self.model_overlay = load_overlay(cfg.model_overlay) if cfg.model_overlay else None
        if self.model_overlay is not None:
            if self.model_overlay.robot not in ("", self.robot_name):
                raise ValueError(
                    f"task.model_overlay={cfg.model_overlay!r} identified a {self.model_overlay.robot}; "
                    f"{cfg.name} runs a {self.robot_name}"
                )
            self.model_overlay.apply_to_backend(self.backend)
        self.controller = ArmController(
            cfg.control or self.default_control,
            self.robot,
            self.backend,
            cfg.max_ee_step,
            cfg.max_joint_step,
            relative_frame=cfg.relative_frame,
        )
        self.arm_actuators = tuple(f"act{i + 1}" for i in range(len(self.robot.joints)))
        self.generator = torch.Generator()  # on the CPU: the same seed draws the same episodes on any device
        self.expert = self.expert_class(cfg.max_ee_step, num_envs, self.device) if self.expert_class else None

    @property
    def action_dim(self) -> int:
        return self.controller.action_dim + int(self.has_gripper)

    @classmethod
    @abstractmethod
    def observation_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        """The state observation: each entry's shape and where a robot gets it (robotrl/core/deploy_spec.py)."""

    @property
    def obs_spec(self) -> dict[str, TensorSpec]:
        return {key: entry.tensor_spec() for key, entry in self.observation_entries(self.robot).items()}

    @classmethod
    def deploy_spec(cls, cfg: Any, frame_stack: int = 1, held: dict[str, list[float]] | None = None) -> DeploySpec:
        """What a robot needs to run a policy trained on this task with `cfg` (its agent stacking `frame_stack`
        camera frames), from the class and the config alone: nothing simulated. `held`: the held sites'
        offsets, measured in the scene (`measure_held_offsets`); a task with held sites needs them."""
        if cfg.obs not in OBS_MODES:
            raise ValueError(f"task.obs must be one of {', '.join(OBS_MODES)}, got {cfg.obs!r}")
        check_camera_crops(cfg.camera_crops, list(cfg.cameras), "task.camera_crops")
        missing = sorted(set(cls.held_sites) - set(held or {}))
        if missing:
            raise ValueError(f"task {cfg.name!r}: its held points {missing} are measured in its scene; give held")
        robot = load_robot_spec(cls.robot_name)
        control = cfg.control or cls.default_control
        observations = dict(cls.observation_entries(robot)) if cfg.obs != "pixels" else {}
        cameras = tuple(cfg.cameras) if cfg.obs != "state" else ()
        stack = frame_stack if cameras else 1  # the training env stacks camera frames only
        for camera in cameras:
            shape = (3 * stack, cfg.image_size, cfg.image_size)
            observations[f"pixels_{camera}"] = ObsEntry(shape, "camera", "uint8", of=camera)
        action_dim = (3 if control == "ee_delta" else len(robot.joints)) + int(cls.has_gripper)
        gripper = robot.gripper
        spec = DeploySpec(
            task=cfg.name,
            task_config=_plain_values(cfg),
            robot=robot.name,
            control=control,
            max_ee_step=float(cfg.max_ee_step),
            max_joint_step=float(cfg.max_joint_step),
            relative_frame=bool(cfg.relative_frame),
            gripper_action=cls.has_gripper,
            # a task that never commands its gripper keeps it shut (the actuator's target stays 0: closed)
            gripper_hold=float(gripper.closed) if gripper is not None and not cls.has_gripper else None,
            episode_steps=cfg.episode_steps or cls.default_episode_steps,
            policy_rate_hz=1.0 / (cfg.control_substeps * (cfg.physics_dt or SIM_TIMESTEP)),
            cameras=cameras,
            image_size=cfg.image_size if cameras else None,
            frame_stack=stack,
            observations=observations,
            action_dim=action_dim,
            action_low=(-1.0,) * action_dim,
            action_high=(1.0,) * action_dim,
            score_reads=tuple(cls.score_reads),
            held={site: tuple(float(v) for v in held[site]) for site in cls.held_sites},
            # where a person puts the objects back between episodes (the boxes reset_scene starts them in)
            start_regions={
                name: (tuple(low.tolist()), tuple(high.tolist())) for name, (low, high) in cls.start_regions.items()
            },
            drawn_goals=tuple(cls.drawn_goals),
        )
        spec.validate()
        return spec

    def object_size(self, name: str, env_ids: torch.Tensor) -> torch.Tensor:
        """[K] the size factor (randomization's body_size, 1 nominal) of resizable object `name` in `env_ids`, on
        the task's device: the randomizer writes it before reset_scene reads it."""
        return self.backend.physics("body_size", (name,))[env_ids.to(self.backend.device), 0].to(self.device)

    def tensor(self, values) -> torch.Tensor:
        """A float32 constant on the task's device."""
        return torch.as_tensor(values, dtype=torch.float32, device=self.device)

    def reset(self, env_ids: torch.Tensor) -> None:
        env_ids = env_ids.to(self.device)
        home = self.robot.home.expand(len(env_ids), -1)
        noise = (torch.rand(home.shape, generator=self.generator).to(self.device) * 2 - 1) * 0.05
        q = torch.maximum(torch.minimum(home + noise, self.robot.position_upper), self.robot.position_lower)
        self.backend.set_joint_state(env_ids, self.robot.joints, q)
        if self.robot.gripper is not None:
            opened = torch.full(
                (len(env_ids), len(self.robot.gripper.joints)), self.robot.gripper.open, device=self.device
            )
            self.backend.set_joint_state(env_ids, self.robot.gripper.joints, opened)
        if self.expert is not None:
            self.expert.reset(env_ids)
        self.reset_scene(env_ids)
        self.backend.forward(env_ids)
        self.controller.reset(env_ids)
        if self.tool_orientation is not None:
            self.controller.target_quat[env_ids] = self.tool_orientation.to(self.device)

    @property
    def commanded_actuators(self) -> tuple[str, ...]:
        """The actuators an action commands: the arm's, and the gripper where the task uses it."""
        return (*self.arm_actuators, "gripper") if self.has_gripper else self.arm_actuators

    def actuator_commands(self, action: torch.Tensor) -> tuple[tuple[str, ...], torch.Tensor]:
        """The targets [E, len(commanded_actuators)] an action asks of the actuators, from the current state."""
        arm_targets = self.controller.joint_targets(action[:, : self.controller.action_dim])
        if not self.has_gripper:
            return self.arm_actuators, arm_targets
        gripper = self.robot.gripper
        finger = gripper.open + (action[:, -1:] + 1.0) * 0.5 * (gripper.closed - gripper.open)
        return self.commanded_actuators, torch.cat([arm_targets, finger], -1)

    def hold_targets(self, env_ids: torch.Tensor) -> torch.Tensor:
        """Targets [K, len(commanded_actuators)] that keep `env_ids` where a reset put them: the arm's joint
        positions, the gripper open."""
        arm = self.backend.joint_pos(self.robot.joints)[env_ids.to(self.device)]
        if not self.has_gripper:
            return arm
        return torch.cat([arm, torch.full((len(arm), 1), self.robot.gripper.open, device=arm.device)], -1)

    def apply_action(self, action: torch.Tensor) -> None:
        self.backend.set_actuators(*self.actuator_commands(action))

    def expert_motion(self) -> torch.Tensor:
        """The scripted expert's action [E, A] for the current state, its motion in world axes: the expert reads
        the entries it needs from the simulator's state, whatever the policy observes."""
        if self.expert is None:
            raise ValueError(f"task {self.cfg.name!r} has no scripted expert")
        obs = self.observe()
        return self.expert.motion({key: obs[key] for key in self.expert.reads})

    def expert_action(self) -> torch.Tensor:
        """The scripted expert's action [E, A] for the current state, in the controller's action frame."""
        return self.controller.world_to_action(self.expert_motion()).cpu()

    def ee_pos(self) -> torch.Tensor:
        return self.backend.site_pose(self.robot.end_effector_site)[0]

    def held_offsets(self) -> dict[str, torch.Tensor]:
        """Each held site's position in the tool point's frame [E, 3], as the scene holds it now."""
        ee, quat = self.backend.site_pose(self.robot.end_effector_site)
        rotation = quat_to_matrix(quat)
        return {
            site: torch.einsum("eji,ej->ei", rotation, self.backend.site_pose(site)[0] - ee) for site in self.held_sites
        }

    def measure_held_offsets(self) -> dict[str, list[float]]:
        """The held sites' offsets in env 0 (after a reset has put the scene in place), for the deploy spec."""
        return {site: [round(float(v), 6) for v in offset[0]] for site, offset in self.held_offsets().items()}

    @classmethod
    def proprio_entries(cls, robot: RobotSpec) -> dict[str, ObsEntry]:
        """The arm's own entries, shared by every arm task's observation."""
        n = len(robot.joints)
        return {
            "arm_qpos": ObsEntry((n,), "joint_state", of="position"),
            "arm_qvel": ObsEntry((n,), "joint_state", of="velocity"),
            "ee_pos": ObsEntry((3,), "kinematics", of="tool_point"),
        }

    def proprio(self) -> Obs:
        return {
            "arm_qpos": self.backend.joint_pos(self.robot.joints),
            "arm_qvel": self.backend.joint_vel(self.robot.joints),
            "ee_pos": self.ee_pos(),
        }

    @abstractmethod
    def reset_scene(self, env_ids: torch.Tensor) -> None:
        """Randomize objects and goals for `env_ids` (arm already placed)."""

    @abstractmethod
    def observe(self) -> Obs: ...

    @abstractmethod
    def evaluate(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(reward [E], success [E] bool, terminated [E] bool) for the current state."""

    def draw_goals(
        self, count: int, objects: dict[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """The goals `drawn_goals` for `count` episodes ([count, ...] each) whose objects start at `objects`
        (name -> position [count, 3]), drawn from `generator` as reset_scene draws them."""
        return {}

    # The observation entries `score` reads; () where the reward needs state no observation holds (contacts).
    # A task that scores from them, or draws goals, does it in module-level torch functions of its module,
    # `score_from_obs(obs, cfg)` and `draw_episode_goals(count, objects, generator)`, which a robot takes by the
    # task's name without building it (robotrl.tasks.task_functions); these methods call them.
    score_reads: tuple[str, ...] = ()

    def score(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(reward [...], success [...]) exactly as `evaluate` gives them, from observation entries alone
        (`score_reads`), so a robot that observes them scores its episodes as simulation does."""
        raise NotImplementedError(f"{type(self).__name__}'s reward needs more than its observation holds")


class TaskEvents(Protocol):
    """Something that acts on a task's simulation at episode starts and control steps (physics randomization:
    robotrl/sim2real/randomization.py), added with TaskVecEnv.add_events."""

    def on_reset(self, env_ids: torch.Tensor) -> None:
        """Before the task places the scene of `env_ids` (a reset's draws hold for the whole episode)."""

    def on_step(self) -> None:
        """After every control step's physics, before the resets of the envs whose episodes it ended."""

    def close(self) -> None: ...


class Actuation(Protocol):
    """How a task's actuator commands reach the simulator, in the place of setting them at once: an actuator model
    (robotrl/sim2real/actuation.py: latency in substeps, a low-pass filter), set with TaskVecEnv.set_actuation."""

    def reset(self, env_ids: torch.Tensor, actuators: Sequence[str]) -> None:
        """After the task reset `env_ids`."""

    def apply(self, actuators: Sequence[str], targets: torch.Tensor, substeps: int) -> None:
        """Send a control step's targets and advance the physics `substeps`."""


class TaskVecEnv:
    """VecEnv over an ArmTask: validated actions, control-rate stepping, time limits, auto-reset. Its tensors are
    on the CPU whatever the simulator's device: the task's own math runs beside the simulator's state (on a GPU,
    thousands of envs' IK and rewards in a few kernels), and only a step's results cross over."""

    def __init__(self, task: ArmTask):
        self.task = task
        self.events: list[TaskEvents] = []
        self.actuation: Actuation | None = None  # None: commands reach the actuators at once
        self.name = task.cfg.name
        self.num_envs = task.num_envs
        self.action_dim, self.control = task.action_dim, task.controller.kind
        self.obs_spec = self._obs_spec()
        self.has_success = True
        self._t = torch.zeros(self.num_envs, dtype=torch.long, device=task.device)

    def add_events(self, events: TaskEvents) -> None:
        self.events.append(events)

    def set_actuation(self, actuation: Actuation) -> None:
        self.actuation = actuation

    def _reset_envs(self, ids: torch.Tensor) -> None:
        for events in self.events:
            events.on_reset(ids)
        self.task.reset(ids)
        if self.actuation is not None:
            self.actuation.reset(ids, self.task.commanded_actuators)
        self._t[ids] = 0

    def _obs_spec(self) -> dict[str, TensorSpec]:
        cfg = self.task.cfg
        spec = dict(self.task.obs_spec) if cfg.obs != "pixels" else {}
        if cfg.obs != "state":
            for camera in cfg.cameras:
                spec[f"pixels_{camera}"] = TensorSpec((3, cfg.image_size, cfg.image_size), torch.uint8)
        return spec

    def _observe(self) -> Obs:
        """The task's state observation and/or camera images ([E, 3, H, W] uint8, one key per camera)."""
        cfg = self.task.cfg
        obs = self.task.observe() if cfg.obs != "pixels" else {}
        # a diverged simulation must not reach a policy or a buffer (one check for all keys: this runs
        # every step, and the per-key search only when something is wrong)
        if obs and not torch.isfinite(torch.cat([value.flatten(1) for value in obs.values()], 1)).all():
            key, value = next((k, v) for k, v in obs.items() if not torch.isfinite(v).all())
            raise FloatingPointError(f"{self.name}: observation[{key!r}] is not finite: {value.tolist()}")
        if cfg.obs != "state":
            for camera in cfg.cameras:
                crop = self.task.camera_crops.get(camera)
                if crop is None:
                    frames = self.task.backend.render(camera, cfg.image_size, cfg.image_size)
                    obs[f"pixels_{camera}"] = frames.permute(0, 3, 1, 2).contiguous()
                    continue
                # a cropped camera is rendered larger, so its region is downsampled to image_size as a robot's is
                size = render_size(crop, cfg.image_size, MAX_RENDER_SIZE)
                frames = self.task.backend.render(camera, size, size).permute(0, 3, 1, 2)
                obs[f"pixels_{camera}"] = crop_and_resize(frames, crop, cfg.image_size)
        return obs

    def reset(self, seed: int | None = None) -> Obs:
        if seed is not None:
            self.task.generator.manual_seed(seed)
        self._reset_envs(torch.arange(self.num_envs, device=self.task.device))
        return _on_cpu(self._observe())

    def step(self, action: torch.Tensor) -> StepResult:
        action = check_action(self.name, action, self.num_envs, self.action_dim).to(self.task.device)
        if self.actuation is None:
            self.task.apply_action(action)
            self.task.backend.step(self.task.cfg.control_substeps)
        else:
            self.actuation.apply(*self.task.actuator_commands(action), self.task.cfg.control_substeps)
        self._t += 1
        next_obs = _on_cpu(self._observe())
        reward, success, terminated = self.task.evaluate()
        if self.task.cfg.terminate_on_success:
            terminated = terminated | success
        truncated = (self._t >= self.task.episode_steps) & ~terminated
        done = terminated | truncated
        obs = next_obs
        for events in self.events:
            events.on_step()
        if done.any():
            self._reset_envs(done.nonzero().flatten())
            obs = _on_cpu(self._observe())
        return StepResult(
            obs=obs,
            next_obs=next_obs,
            reward=reward.cpu(),
            terminated=terminated.cpu(),
            truncated=truncated.cpu(),
            success=success.cpu(),
        )

    def render(self) -> np.ndarray:
        cfg = self.task.cfg
        return self.task.backend.render(cfg.camera, cfg.render_width, cfg.render_height)[0].numpy()

    def close(self) -> None:
        for events in self.events:
            events.close()
        self.task.backend.close()


def _on_cpu(obs: Obs) -> Obs:
    return {key: value.cpu() for key, value in obs.items()}


def _plain_values(cfg: Any) -> dict[str, Any]:
    """A task config's settings as JSON values (the deploy spec's task_config)."""
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    return {key: value for key, value in vars(cfg).items() if not key.startswith("_")}
