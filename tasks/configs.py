"""Structured configs of the task group (no simulator imports: the config layer reads these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# simulators of the built-in tasks (task.backend, or top-level `backend`)
BACKENDS = ("mujoco", "genesis", "mujoco_warp")


@dataclass
class GymTaskConfig:
    """Any gymnasium env with a Box action space, e.g. `task=gym task.env_id=HalfCheetah-v5`."""

    name: str = "gym"
    env_id: str = "Pendulum-v1"
    max_episode_steps: int | None = None  # None: the env's registered limit
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gymnasium.make
    render_width: int = 256
    render_height: int = 256


@dataclass
class ArmTaskConfig:
    """A built-in simulated arm task, e.g. `task=panda_reach task.reward=sparse`."""

    name: str = "panda_reach"
    backend: str = "mujoco"
    control: str | None = None  # ee_delta | joint_delta | joint_position; None: the task's own (arm ee_delta)
    relative_frame: bool = False  # ee_delta actions in the tool's start frame (observations stay in world axes)
    reward: str = "dense"  # dense | sparse
    episode_steps: int | None = None  # None: the task's own default (reach 50, pick 100)
    control_substeps: int = 20  # physics steps per control step (0.002 s each: 25 Hz control)
    # Seconds per physics step; null: the scene's own (0.002). The control period is control_substeps * physics_dt,
    # so fewer, longer steps keep the policy's rate: bench/substeps.py finds per task the fewest at which the
    # scripted expert still succeeds and contacts stay shallow (e.g. control_substeps=5 physics_dt=0.008).
    physics_dt: float | None = None
    sim_threads: int = 1  # threads stepping the envs when num_envs > 1 (MuJoCo backend)
    max_ee_step: float = 0.05  # metres per control step at |action| = 1
    max_joint_step: float = 0.1  # radians per control step at |action| = 1 (joint_delta)
    success_threshold: float = 0.05  # metres (as gymnasium-robotics Fetch)
    terminate_on_success: bool = False  # end the episode at the first success (HIL-SERL's setting)
    obs: str = "state"  # state | pixels | state+pixels
    cameras: list[str] = field(default_factory=lambda: ["front"])  # pixel observation cameras: front, wrist
    image_size: int = 84  # square pixel observations, 64 to 128
    # camera -> [top, bottom, left, right] fractions of its frame: the region the policy sees (HIL-SERL crops its
    # views so), rendered larger and area-resized to image_size; a robot crops its frames the same way
    # (hardware.camera_crops, robotrl/core/camera_crop.py)
    camera_crops: dict[str, list[float]] = field(default_factory=dict)
    render_width: int = 256  # videos
    render_height: int = 256
    camera: str = "front"  # video camera
    # Joint dynamics and command latency identified on a robot (robotrl-sysid's overlay.yaml, docs/sim2real.md),
    # written into every env: the model a policy trains on, and randomization's ranges, then centre on that robot
    model_overlay: str | None = None


@dataclass
class HandTaskConfig(ArmTaskConfig):
    """The four-finger hand task, e.g. `task=hand_reorient task.goal_rotation=any`."""

    name: str = "hand_reorient"
    goal_rotation: str = "z"  # z: goals turn the cube about the vertical; any: about a random axis
    rotation_threshold: float = 0.4  # radians from the goal orientation that count as success
    drop_height: float = 0.05  # metres below the palm at which the cube counts as dropped
