"""A gymnasium env over the ROS 2 bridge: a real robot (or `robotrl-sim-twin`) as a policy sees it.

    env = RobotEnv(RobotEnvConfig(domain_id=42), control="ee_delta", goal={"target": [0.5, 0.0, 0.3]},
                   relative_goal={"to_target": "target"})
    obs, info = env.reset()                      # moves to the spec's home pose through the shield
    obs, reward, terminated, truncated, info = env.step(action)
    env.close()                                  # no new commands; the arm finishes its move and rests

Observations are built from topics: `/joint_states` gives the state entries every simulated arm task
shares (`arm_qpos`, `arm_qvel`, `ee_pos` by forward kinematics of the robot's MJCF, `gripper` when a task
uses it), `goal` gives the task entries a robot cannot measure (a target, a hole) as fixed values and
`relative_goal` those that are `goal - ee_pos`; cameras give `pixels_<name>` ([3, S, S] uint8; a mono8
camera's grey is repeated in the three channels); tracked objects (`objects`, a geometry_msgs/PoseStamped
each from a motion-capture system or a fiducial detector) give `<name>_pos`, `<name>_quat`, `to_<name>` and
`<name>_to_<goal>` (`object_entries`); a pose that jumped from the last one acted on faster than
`max_object_speed` (a marker swap) is not acted on until it could be real.

Between episodes, once home, `reset()` waits (up to `scene_timeout`) for a person to put each tracked object
with a `start_regions` box (the box the simulated task starts it in: push's puck, pick's cube) back in it and
leave it still for `scene_settle`, and refuses by name (`SceneResetError`) when nobody does: no episode starts
from a layout the policy never saw (`reset(options={"cancel": event})` ends the wait early: `EnvCancelled`).
A shield latched meanwhile (an e-stop pressed at the table) refuses the reset until acknowledged. A
`goal_sampler` (the task's own `draw_goals`) then draws the episode's goals, as simulation does: reach's
target from its box, push's goal around where the puck now is.

Every observation's age is checked (time since the newest message arrived): a stale one is never acted on; the
step sends no command (the shield holds) and reports `stale_observation` in `info`, or raises
`StaleObservationError` (`on_stale=raise`). Nor is an action whose observation has aged past
`max_state_age` (its tracked poses past `max_object_age`, its camera frames past `max_image_age`) plus one
policy period by the time `step` receives it (`late_action`).

Commands: a control thread runs at `control_rate_hz` (the shield's control period) and, every period,
passes the newest policy command (or None) through `robotrl.safety.Shield.filter` with the newest joint
state, then publishes the shield's setpoint on `/<controller>/commands` (std_msgs/Float64MultiArray, the
forward_position_controller of ros2_control) and the gripper on `/<gripper_controller>/commands` (or, with
`hardware.gripper_interface=franka_action|gripper_command`, as ROS 2 action goals: hardware/gripper_actions.py). The
policy runs at `policy_rate_hz`: `step()` converts the action to joint targets as the simulated task's
controller does (ee_delta: damped least-squares IK holding the start orientation, the motion in the tool's
start frame under `relative_frame`; joint_delta; joint_position), hands it to the control thread and
returns the observation at the next policy tick. The shield's corrections in that policy period are
reported in `info` (`safety/<kind>`: control periods in which it fired). An e-stop topic (std_msgs/Bool)
latches the shield's e-stop: every true message does, however short the press, from a latched or a
default-QoS publisher; it counts as pressed while any live publisher on it last said true
(`hardware/estop.py`). After its release, a true message on the acknowledgement topic (or
`acknowledge_estop()`) lets the next `reset()` restart. Until then every reset is refused, so an episode's
automatic reset never drives the arm after a stop by itself; nor does a reset start while nothing publishes
on the e-stop topic (`require_estop_publisher`).

The parts, one job each: `robot_link.RobotLink` (topics, the control thread, the shield, the e-stop, real-time
scheduling), `robot_observation.ObservationAssembler` (messages to entries, ages, stale and late reasons,
tracker jumps, frame stacking), `scene_reset.SceneReset` (the scene between episodes, drawn goals) and
`robot_kinematics.Kinematics` (the MJCF's forward kinematics); the settings are `robot_env_config`'s. This
module composes them and converts actions to joint targets as the simulated task's controller does.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.robot_kinematics import ASSETS, Kinematics, rotation_matrix
from robotrl.hardware.robot_link import EStopMissingError, ResetTimeoutError, RobotLink
from robotrl.hardware.robot_observation import (
    ObjectPart,
    ObservationAssembler,
    StaleObservationError,
    object_entries,
)
from robotrl.hardware.scene_reset import SETTLE_DISTANCE, SceneReset, SceneResetError

from robotrl.core.robot_spec import load_robot_spec
from robotrl.core.rotations import rotation_error
from robotrl.safety import PoseShield, Shield

# the names deploy, the actor and the tests import from here, wherever they are defined
__all__ = [
    "ASSETS",
    "CONTROLS",
    "SETTLE_DISTANCE",
    "EStopMissingError",
    "ResetTimeoutError",
    "RobotEnv",
    "RobotEnvConfig",
    "SceneResetError",
    "StaleObservationError",
    "object_entries",
]

log = logging.getLogger(__name__)

CONTROLS = ("ee_delta", "joint_delta", "joint_position")
# m inside the shield's workspace box (its margin included) an ee_delta target beyond a face is clamped to
BOX_SLACK = 0.005


class RobotEnv(gym.Env):
    """See the module docstring. `control`, `max_ee_step`, `max_joint_step`, `relative_frame`, `gripper_action`,
    `goal`, `relative_goal` and `episode_steps` come from the simulated task a policy was trained on."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        cfg: RobotEnvConfig,
        control: str = "joint_delta",
        max_ee_step: float = 0.05,
        max_joint_step: float = 0.1,
        gripper_action: bool = False,
        gripper_obs: bool = False,
        goal: dict[str, list[float]] | None = None,
        relative_goal: dict[str, str] | None = None,
        episode_steps: int | None = None,
        frame_stack: int = 1,
        observe: list[str] | None = None,
        bridge: Any | None = None,
        relative_frame: bool = False,
        gripper_hold: float | None = None,
        held: dict[str, list[float]] | None = None,
        held_relative: dict[str, list[str]] | None = None,
        start_regions: dict[str, list[list[float]]] | None = None,
        goal_sampler: Callable[[dict[str, np.ndarray], torch.Generator], dict[str, np.ndarray]] | None = None,
        state_keys: dict[str, str] | None = None,
        object_parts: dict[str, ObjectPart] | None = None,
    ):
        cfg.validate()
        if not (isinstance(frame_stack, int) and frame_stack >= 1):
            raise ValueError(f"frame_stack must be an integer >= 1, got {frame_stack!r}")
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {', '.join(CONTROLS)}, got {control!r}")
        if not isinstance(relative_frame, bool):
            raise ValueError(f"relative_frame must be true or false, got {relative_frame!r}")
        if relative_frame and control != "ee_delta":
            raise ValueError(f"relative_frame=true rotates ee_delta actions; control is {control!r}")
        self.cfg = cfg
        self.spec = load_robot_spec(cfg.robot)
        if control == "ee_delta" and self.spec.end_effector_site is None:
            raise ValueError(f"control=ee_delta needs a tool point; robot {cfg.robot!r} has none")
        if cfg.command == "cartesian_pose" and control != "ee_delta":
            raise ValueError(
                "hardware.command=cartesian_pose sends tool poses: it runs ee_delta policies, this one acts by "
                f"{control}"
            )
        if (gripper_action or gripper_obs) and (self.spec.gripper is None or not cfg.gripper_controller):
            raise ValueError(f"the policy uses a gripper; robot {cfg.robot!r} has none (or no gripper_controller)")
        self.control, self.max_ee_step, self.max_joint_step = control, max_ee_step, max_joint_step
        # ee_delta motions are in the tool's frame at the episode's start (set at reset), as the simulated
        # controller's relative_frame; observations stay in world axes
        self.relative_frame = relative_frame
        self._action_frame = np.eye(3)
        self.gripper_action, self.gripper_obs = gripper_action, gripper_obs
        if gripper_hold is not None and (gripper_action or not math.isfinite(gripper_hold)):
            raise ValueError(f"gripper_hold is for policies that do not move the gripper, got {gripper_hold!r}")
        # where the policy does not move the gripper, the fingers stay where the simulated task keeps them
        # (its gripper actuator never commanded: shut); None: opened at each reset, as for a gripper policy
        self.gripper_hold = gripper_hold
        self.goal = {k: np.asarray(v, dtype=np.float32) for k, v in (goal or {}).items()}
        for key, value in self.goal.items():
            if value.shape != (3,) and key in (relative_goal or {}).values():
                raise ValueError(f"goal {key!r} must have 3 values to be relative to ee_pos, got {value.tolist()}")
        self.relative_goal = dict(relative_goal or {})
        missing = sorted(set(self.relative_goal.values()) - set(self.goal))
        if missing:
            raise ValueError(f"relative_goal refers to goals {missing} that goal does not give")
        # points fixed to the tool (a held peg's tip): entry -> offset in the tool point's frame; and entries that
        # are a goal minus such a point (peg_insert's tip_to_hole): entry -> [goal, point]
        self.held = {k: np.asarray(v, dtype=np.float64) for k, v in (held or {}).items()}
        bad = {k: v.tolist() for k, v in self.held.items() if v.shape != (3,) or not np.isfinite(v).all()}
        if bad:
            raise ValueError(f"held points need 3 finite offsets (metres, in the tool frame), got {bad}")
        self.held_relative = {k: tuple(v) for k, v in (held_relative or {}).items()}
        for key, pair in self.held_relative.items():
            if len(pair) != 2 or pair[0] not in self.goal or pair[1] not in self.held:
                raise ValueError(
                    f"held_relative.{key} must be [goal, held point] among goals {sorted(self.goal)} and held "
                    f"points {sorted(self.held)}, got {list(pair)}"
                )
            if self.goal[pair[0]].shape != (3,):
                raise ValueError(f"goal {pair[0]!r} must have 3 values to be relative to {pair[1]!r}")
        self.episode_steps = episode_steps
        self.n = len(self.spec.joints)
        self.joint_names = list(self.spec.joints)
        model_file = Path(cfg.model) if cfg.model else ASSETS / f"{cfg.robot}.xml"
        self.kinematics = Kinematics(model_file, self.spec)
        self.shield = Shield.from_spec(self.spec, cfg.shield_config(), model_file)
        # command=cartesian_pose: every equilibrium pose passes this (robotrl/safety/pose_shield.py)
        self.pose_shield = PoseShield(cfg.pose_limits()) if cfg.command == "cartesian_pose" else None
        self.lower = self.spec.position_lower.double().numpy()
        self.upper = self.spec.position_upper.double().numpy()
        self.action_dim = (3 if control == "ee_delta" else self.n) + int(gripper_action)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.action_dim,), np.float32)
        self.stats: Counter[str] = Counter()  # commands, missed periods, stale observations, bad states

        self.frame_stack = frame_stack  # camera frames per pixel observation, oldest first (as FrameStack)
        self.observations = ObservationAssembler(
            cfg,
            self.spec,
            self.kinematics,
            self.stats,
            self.goal,
            self.relative_goal,
            self.held,
            self.held_relative,
            gripper_obs,
            frame_stack,
            observe,
            state_keys,
            object_parts,
        )
        self.observation_space = self.observations.observation_space
        self.tracked_objects = self.observations.tracked_objects
        ignored = sorted(set(cfg.objects) - set(self.tracked_objects))
        if ignored:
            log.info("robot env: the policy observes nothing of tracked objects %s; not listening to them", ignored)
        self.scene = SceneReset(
            cfg, self.tracked_objects, self.goal, self._scene_pose, start_regions, goal_sampler, self._request_scene
        )
        # the control thread computes the e-stop's hold pose with a model of its own: MuJoCo's data is not shared
        # between threads, and the policy thread may be solving a pose in this one at that moment
        hold_pose = None
        if cfg.command == "cartesian_pose":
            hold_kinematics = Kinematics(model_file, self.spec)

            def hold_pose(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                return hold_kinematics.pose(q)[:2]

        self.link = RobotLink(cfg, self.spec, self.shield, self.stats, self.tracked_objects, bridge, hold_pose)

        self._last_obs: dict[str, np.ndarray] | None = None
        self._last_target = np.zeros(self.n)
        self._target_quat = np.array([1.0, 0.0, 0.0, 0.0])
        self._t = 0
        self._next_tick = time.monotonic()

    # -- the parts' figures, read where the env was read before it had parts -------------------------------
    start_regions = property(lambda self: self.scene.start_regions)
    goal_sampler = property(lambda self: self.scene.goal_sampler)
    drawn_goals = property(lambda self: self.scene.drawn_goals)
    ages = property(lambda self: self.observations.ages)  # joint-state age at each observation (s)
    bridge = property(lambda self: self.link.bridge)
    topics = property(lambda self: self.link.topics)
    totals = property(lambda self: self.link.totals)  # shield corrections (control periods) over the env's life
    state_period = property(lambda self: self.link.state_period)  # measured joint-state interval, first reset
    # the watchdog, measured: the oldest state the shield still tracked on, the state's age at each stall
    max_tracked_state_age = property(lambda self: self.link.max_tracked_state_age)
    stall_reactions = property(lambda self: self.link.stall_reactions)

    # -- observations -----------------------------------------------------------------------------------
    def _observe(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The observation from the newest messages, and whether it is fresh enough to act on."""
        now = time.monotonic()
        state, refused = self.link.judged_state()
        poses = {name: sub.latest() for name, sub in self.link.object_poses.items()}
        frames = {name: sub.latest() for name, sub in self.link.images.items()}
        return self.observations.assemble(state, refused, now, poses, frames)

    def _scene_pose(self, name: str) -> tuple[np.ndarray, str | None]:
        """An object's newest position for the scene's wait, and what keeps it from being used (None: none)."""
        (position, _), _, problem = self.observations.objects.read(self.link.object_poses[name].latest(), count=False)
        return position, problem

    def _request_scene(self) -> None:
        self.link.request_scene_reset()

    # -- actions -----------------------------------------------------------------------------------
    def _joint_targets(self, action: np.ndarray, q: np.ndarray) -> np.ndarray:
        arm = action[: self.action_dim - int(self.gripper_action)].astype(np.float64)
        if self.control == "joint_position":
            target = self.lower + (arm + 1.0) * 0.5 * (self.upper - self.lower)
        elif self.control == "joint_delta":
            target = self._last_target + arm * self.max_joint_step
        else:
            position, quat, jac = self.kinematics.pose(q)
            step = self._action_frame @ (arm * self.max_ee_step)
            if self.shield.box is not None:
                # the tool's target is kept in the box axis by axis, as SERL clips its Cartesian target: the shield
                # cuts a move leaving the box along its whole segment, so a step into the floor lost its sideways
                # part (pick on the twin stalled 3 cm beside the cube). BOX_SLACK is room for a joint-space path
                # along a face, which bows out of the straight line (docs/safety.md)
                step = self.shield.box.clamp_inside(position + step, BOX_SLACK) - position
            error = np.concatenate(
                [
                    step,
                    rotation_error(
                        torch.tensor(self._target_quat, dtype=torch.float32)[None],
                        torch.tensor(quat, dtype=torch.float32)[None],
                    )[0]
                    .double()
                    .numpy(),
                ]
            )
            jjt = jac @ jac.T + 0.05**2 * np.eye(6)
            target = q + jac.T @ np.linalg.solve(jjt, error)
        target = np.clip(target, self.lower, self.upper)  # NaN stays NaN: the shield drops it
        if np.isfinite(target).all():
            self._last_target = target
        return target

    def _tool_pose(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        position, quat, _ = self.kinematics.pose(q)
        return position, quat

    def _send_pose(self, target: np.ndarray, quat: np.ndarray, q: np.ndarray) -> dict[str, int]:
        """The equilibrium (`target`, `quat`) through the pose shield, from the tool's pose at measured joints `q`,
        sent if it lets it through; the shield's corrections."""
        position, measured_quat = self._tool_pose(q)
        safe, info = self.pose_shield.filter(target, quat, position, measured_quat)
        if safe is not None:
            self.link.publish_pose(safe.position.numpy(), safe.quat.numpy())
        return {key: value for key, value in info.items() if value}

    def world_to_action(self, action: torch.Tensor) -> torch.Tensor:
        """An action [N, A] whose first three entries are a motion in the robot's base axes (a teleop
        device's), expressed in this env's action frame (the tool's start frame under `relative_frame`),
        clipped to [-1, 1]: what ArmController.world_to_action does in simulation."""
        if self.control != "ee_delta" or not self.relative_frame:
            return action
        frame = torch.as_tensor(self._action_frame, dtype=action.dtype)
        motion = (action[:, :3] @ frame).clamp(-1.0, 1.0)  # each row times frame: frame^T @ motion
        return torch.cat([motion, action[:, 3:]], -1)

    # -- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        cfg, link = self.cfg, self.link
        deadline = time.monotonic() + cfg.connect_timeout
        while (state := link.locked_state()) is None or state.stamp < time.monotonic() - cfg.max_state_age:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no fresh joint state on {cfg.joint_states_topic} within {cfg.connect_timeout} s (domain "
                    f"{cfg.domain_id}, loopback={cfg.loopback}): is the robot driver or robotrl-sim-twin running?"
                )
            time.sleep(0.01)
        if link.state_period is None and self.shield.config.watchdog:
            link.check_state_rate()
        link.require_estop_publisher(deadline)
        link.restart_shield(deadline + cfg.reset_timeout)
        self._go_home()
        if seed is not None:
            self.scene.seed(seed)
        positions = self.scene.wait((options or {}).get("cancel"))  # a threading.Event ends the wait
        # while a person was in the workspace an e-stop press (or a joint-state stall) may have latched the
        # shield, or the arm been pushed: restart (refused while the e-stop is unacknowledged), home again
        if link.latched is not None or not self._at_home():
            link.restart_shield(time.monotonic() + cfg.reset_timeout)
            self._go_home()
        if self.scene.goal_sampler is not None:
            self.scene.draw_goals(positions)
        self.observations.objects.forget_motion()  # a person moved the objects between episodes
        link.take_info()
        obs, info = self._observe()
        obs = self.observations.stack(obs, fresh=True)
        q = self.observations.state.position.numpy()
        self._last_target = q.copy()
        if self.control == "ee_delta":
            _, self._target_quat, _ = self.kinematics.pose(q)
            if self.relative_frame:
                self._action_frame = rotation_matrix(self._target_quat)
        self._t = 0
        self._last_obs = obs
        self._next_tick = time.monotonic() + 1.0 / cfg.policy_rate_hz
        return obs, info

    def _go_home(self) -> None:
        """Move to the spec's home pose through the shield and wait until the arm rests there (reset_timeout).
        command=cartesian_pose: through the pose shield to the tool's pose at the home joints."""
        cfg, home = self.cfg, self.spec.home.double().numpy()
        deadline = time.monotonic() + cfg.reset_timeout
        if self.pose_shield is not None:
            home_pose = self._tool_pose(home)
            self.pose_shield.reset(*self._tool_pose(self.link.locked_state().position.numpy()))
        while True:
            fingers = None
            if self.link.drives_gripper:
                fingers = self.spec.gripper.open if self.gripper_hold is None else self.gripper_hold
            if self.pose_shield is None:
                self.link.post(home, fingers)
            else:
                state = self.link.locked_state()
                if time.monotonic() - state.stamp <= cfg.max_state_age:  # never a pose led from a stale one
                    self._send_pose(*home_pose, state.position.numpy())
                if fingers is not None:
                    self.link.post_gripper(fingers)
            time.sleep(1.0 / cfg.policy_rate_hz)
            if self._at_home():
                return
            state = self.link.locked_state()
            error = np.abs(state.position.numpy() - home)
            speed = np.abs(state.velocity.numpy()) if state.velocity is not None else np.zeros(self.n)
            fresh = time.monotonic() - state.stamp <= cfg.max_state_age
            if time.monotonic() > deadline:
                latched = self.link.latched
                raise ResetTimeoutError(
                    f"home pose not reached within {cfg.reset_timeout} s: joint errors {np.round(error, 4).tolist()} "
                    f"rad (tolerance {cfg.reset_tolerance}), speeds {np.round(speed, 4).tolist()} rad/s"
                    + (f", shield latched: {latched}" if latched else "")
                    + (", joint state stale" if not fresh else "")
                )

    def _at_home(self) -> bool:
        """Whether the newest joint state is fresh and at rest at home, as `_go_home` leaves the arm (the joints
        within reset_tolerance; with command=cartesian_pose the tool within pose_reset_tolerance and
        pose_reset_angle of its home pose)."""
        cfg, state = self.cfg, self.link.locked_state()
        if state is None or time.monotonic() - state.stamp > cfg.max_state_age:
            return False
        speed = np.abs(state.velocity.numpy()).max() if state.velocity is not None else 0.0
        home = self.spec.home.double().numpy()
        if self.pose_shield is None:
            error = np.abs(state.position.numpy() - home).max()
            return bool(error <= cfg.reset_tolerance and speed <= cfg.reset_velocity)
        (position, quat), (home_position, home_quat) = self._tool_pose(state.position.numpy()), self._tool_pose(home)
        angle = 2.0 * math.acos(min(1.0, abs(float(np.dot(quat, home_quat)))))
        distance = float(np.linalg.norm(position - home_position))
        return distance <= cfg.pose_reset_tolerance and angle <= cfg.pose_reset_angle and speed <= cfg.reset_velocity

    def step(self, action):
        if self._last_obs is None:
            raise RuntimeError("call reset() before step()")
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (self.action_dim,):
            raise ValueError(f"action must have {self.action_dim} values, got shape {action.shape}")
        info: dict[str, Any] = {}
        if not np.isfinite(action).all():
            info["non_finite_action"] = 1
            self.stats["non_finite_actions"] += 1
        if np.abs(action[np.isfinite(action)]).max(initial=0.0) > 1.0:
            info["action_clipped"] = 1
        action = np.clip(action, -1.0, 1.0)  # NaN stays NaN (the shield drops it)
        self.link.check_estop_publisher()  # gone: nothing could stop the arm now, so it counts as pressed
        # The observation was fresh when it was taken; the action is only as fresh as that observation. One
        # computed after a stall (slow inference, a weight load, a paused process) is not sent either.
        period, observations = 1.0 / self.cfg.policy_rate_hz, self.observations
        late = observations.late_reason(time.monotonic(), period) if observations.fresh else None
        if late:
            self.stats["late_actions"] += 1
            info["late_action"] = 1
            info["late_reason"] = late
            if self.cfg.on_stale == "raise":
                raise StaleObservationError(f"the action was computed from an observation whose {late}")
        if observations.fresh and not late:
            q = observations.state.position.numpy()
            gripper = None
            if self.gripper_action:
                g = self.spec.gripper
                gripper = g.open + (action[-1] + 1.0) * 0.5 * (g.closed - g.open)
            if self.pose_shield is not None:
                # the step moves the last equilibrium, not the measured tool: a compliant arm drifts off its line as
                # it accelerates, and an equilibrium re-anchored to it each step follows the drift instead of pulling
                # it back (peg insertion on the twin: 4 mm of lateral drift per descent, the rim never cleared). The
                # pose shield's lead bound keeps the equilibrium within reach of the tool.
                arm = action[: self.action_dim - int(self.gripper_action)]
                anchor, _ = self.pose_shield.last
                target = anchor.numpy() + self._action_frame @ (arm * self.max_ee_step)
                info.update(self._send_pose(target, self._target_quat, q))
                if gripper is not None:
                    self.link.post_gripper(gripper)
            else:
                self.link.post(self._joint_targets(action, q), gripper)
        else:
            info["skipped_stale"] = 1  # an action computed from a stale observation is not sent
        delay = self._next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            self.stats["late_policy_steps"] += 1
        # late (a slow policy or a stall): the next tick is a whole period from now, never a burst of steps
        self._next_tick = max(self._next_tick, time.monotonic()) + period
        obs, obs_info = self._observe()
        obs = observations.stack(obs, fresh=False)
        info.update(obs_info)
        info.update(self.link.take_info())
        info["shield_latched"] = int(self.link.latched is not None)
        self._t += 1
        self._last_obs = obs
        truncated = self.episode_steps is not None and self._t >= self.episode_steps
        return obs, 0.0, False, truncated, info

    def estop(self, active: bool = True) -> None:
        """The same as a message on the e-stop topic."""
        self.link.estop(active)

    def acknowledge_estop(self) -> None:
        """The same as a true message on the acknowledgement topic: after the e-stop is released, the next
        reset() may restart (raises while the e-stop, by any live publisher on its topic, is still pressed or
        not known to be released)."""
        self.link.acknowledge_estop()

    @property
    def at_rest(self) -> bool:
        """The shield's setpoint has stopped, read between control periods (`RobotLink.at_rest`)."""
        return self.link.at_rest

    @property
    def setpoint(self) -> np.ndarray | None:
        """The last setpoint published."""
        return self.link.setpoint

    def close(self) -> None:
        """Send no new targets; the arm finishes its last safe move (or the command timeout holds it), and
        once the setpoint rests the control thread stops and the bridge is left. A move still under way after
        `close_timeout` is braked (the shield's e-stop) before the thread stops: a forward controller left
        holding a moving setpoint would stop the arm dead."""
        if self.link.closed:
            return
        self.link.close()
        super().close()
