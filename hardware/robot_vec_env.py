"""One robot as a `VecEnv` (num_envs=1), so `robotrl-actor` can act on the robot and stream to a learner.

The robot env (hardware/robot_env.py) gives observations with the simulated task's keys and sends actions
through the shield; this adds what a learner needs and a robot does not measure by itself:

- **Reward and success.** `reward=task` (the default wherever it applies) is the simulated task's own
  `score(obs)`, its reward and success computed from observation entries alone (`score_reads`; tested equal
  to `evaluate` in simulation): reach (`-distance` to the target, or `success - 1`), push with its puck
  tracked (`hardware.objects`), peg_insert with the peg's tip from kinematics. `goal_distance`, reach's
  rule before tasks scored themselves, is the same thing under its older name. Where the reward
  needs state no observation holds (pick: the fingers' contacts), or the policy observes pixels, it is
  `reward=classifier`: the learned reward classifier (`hil.reward_classifier`, on camera frames, as
  HIL-SERL does) wraps this env and replaces both.
- **A scene and a goal per episode.** Each reset waits, the arm at home, for the person to put the tracked
  objects back where the task starts them (robot_env.py; an actor keeps waiting, logging what is missing,
  until its stop is set). The robot env then draws the task's goals as the simulated task does (reach's
  target from its box, push's goal around the measured puck), so the policy keeps seeing the spread of
  goals it was trained on; `goal_range` replaces that with a box of one's own, drawn uniformly, and `goal`
  fixes a goal. A seed repeats the draws (push's goal also follows where the puck was put).
- **Honest transitions.** An observation that arrives stale (the shield held; the action may not have run
  as recorded), or an action computed too late to be sent, ends the episode as truncated, so no transition
  claims a result its action did not have; the next reset waits for fresh joint states and moves home
  through the shield.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from robotrl.tasks import deploy_spec_for, task_class, task_functions

from robotrl.core.deploy_spec import DeploySpec, read_deploy_spec
from robotrl.core.env import EnvCancelled, Obs, StepResult, check_action
from robotrl.core.spec import TensorSpec
from robotrl.safety import EStopLatchedError

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the robot env imports MuJoCo (forward kinematics); the configs here must not
    from robotrl.hardware.robot_env import RobotEnv


# operator: nothing scores the episode here; a person marks success with a key or button (robotrl-record on a
# robot, for a task that cannot score itself there: its success frames train the reward classifier)
REWARDS = ("goal_distance", "task", "classifier", "operator")


def goal_box(name: str, box) -> tuple[np.ndarray, np.ndarray]:
    """The (low, high) corners of a goal box given as [[low...], [high...]], or ValueError naming `name`."""
    bad = ValueError(f"{name} must be [[low...], [high...]] with low <= high, got {box}")
    if len(box) != 2:
        raise bad
    try:
        low, high = np.asarray(box[0], np.float32), np.asarray(box[1], np.float32)
    except (TypeError, ValueError):
        raise bad from None
    if low.shape != high.shape or not (low <= high).all():  # NaN corners fail `<=` too
        raise bad
    return low, high


@dataclass
class RobotRewardConfig:
    """How a robot episode is scored; the actor fills it from the task (`reward_for_task`)."""

    # task (the task's own score) | classifier (a learned classifier wraps the env) | operator (a person marks
    # success: every reward here is 0)
    kind: str = "task"
    reads: list[str] = field(default_factory=list)  # task: the observation entries its score reads
    terminate_on_success: bool = False
    goal_range: dict[str, list[list[float]]] = field(default_factory=dict)  # key: [[low xyz], [high xyz]]

    def validate(self, env: RobotEnv) -> None:
        if self.kind not in ("task", "classifier", "operator"):
            raise ValueError(f"robot reward must be task, classifier or operator, got {self.kind!r}")
        missing = sorted(set(self.reads) - set(env.observation_space.spaces)) if self.kind == "task" else []
        if missing:
            raise ValueError(f"the task's reward reads {missing}, which this robot env does not observe")
        for key, box in self.goal_range.items():
            if key not in env.goal:
                raise ValueError(f"goal_range.{key}: the robot env has no goal {key!r} (goals: {sorted(env.goal)})")
            low, _ = goal_box(f"goal_range.{key}", box)
            if low.shape != env.goal[key].shape:
                raise ValueError(
                    f"goal_range.{key} has corners of shape {low.shape}, the goal {key!r} {env.goal[key].shape}"
                )


class RobotVecEnv:
    """See the module docstring. `env` is closed with this one."""

    num_envs = 1

    def __init__(
        self,
        env: RobotEnv,
        reward: RobotRewardConfig,
        score: Callable | None = None,
        stop: threading.Event | None = None,
    ):
        """`score(obs) -> (reward, success)`: the simulated task's, from observation entries (reward=task).
        `stop` (the actor's) ends a reset's wait for the scene with EnvCancelled."""
        reward.validate(env)
        if reward.kind == "task" and score is None:
            raise ValueError("reward=task needs the task's score (its reward and success given an observation)")
        self.env, self.reward_cfg, self.score = env, reward, score
        self.name = f"robot:{env.cfg.robot}"
        self.action_dim, self.control = env.action_dim, env.control
        self.obs_spec = {
            key: TensorSpec(tuple(space.shape), torch.uint8 if space.dtype == np.uint8 else torch.float32)
            for key, space in env.observation_space.spaces.items()
        }
        self.has_success = reward.kind == "task"
        self.stop = stop
        self._rng = np.random.default_rng()
        self.stale_episodes = 0  # episodes cut short by a stale observation

    def reset(self, seed: int | None = None) -> Obs:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        for key, (low, high) in self.reward_cfg.goal_range.items():
            self.env.goal[key] = self._rng.uniform(low, high).astype(np.float32)
        # lazy (start-up time): the robot env loads MuJoCo (kinematics) and the bridge; this module is the actor's
        # config in simulation too
        from robotrl.hardware.robot_env import SceneResetError

        # an actor waits for its person as long as it takes (the scene put back, an e-stop pressed at the table
        # acknowledged) until its stop is set; deploy ends its session instead; without a stop, nothing waits
        while True:
            try:
                obs, _ = self.env.reset(seed=seed, options={"cancel": self.stop})
                return self._tensors(obs)
            except (SceneResetError, EStopLatchedError) as error:
                if self.stop is None:
                    raise
                log.warning("robot: %s; still waiting", error)
                if self.stop.wait(1.0 if isinstance(error, EStopLatchedError) else 0.0):
                    raise EnvCancelled(f"stopped while waiting: {error}") from error

    def world_to_action(self, action: torch.Tensor) -> torch.Tensor:
        return self.env.world_to_action(action)

    def step(self, action: torch.Tensor) -> StepResult:
        action = check_action(self.name, action, 1, self.action_dim)
        obs, _, terminated, truncated, info = self.env.step(action[0].numpy())
        next_obs = self._tensors(obs)
        reward, success = self._score(next_obs)
        if info.get("stale_observation") or info.get("late_action"):
            self.stale_episodes += 1
            truncated = True
            success = False  # not on old evidence (a tracker that lost the puck): the episode is cut, not won
        terminated = terminated or (success and self.reward_cfg.terminate_on_success)
        done = terminated or truncated
        reset_obs = next_obs
        if done:
            try:
                reset_obs = self.reset()
            except EnvCancelled:  # stopped while the next episode's scene was awaited: this step still counts
                reset_obs = next_obs
        return StepResult(
            obs=reset_obs,
            next_obs=next_obs,
            reward=torch.tensor([reward], dtype=torch.float32),
            terminated=torch.tensor([terminated]),
            truncated=torch.tensor([truncated and not terminated]),
            success=torch.tensor([success]),
        )

    def _score(self, obs: Obs) -> tuple[float, bool]:
        if self.reward_cfg.kind != "task":
            return 0.0, False  # the classifier wrapper scores this step, or the operator marks success
        reward, success = self.score(obs)
        return float(reward[0]), bool(success[0])

    @staticmethod
    def _tensors(obs: dict[str, np.ndarray]) -> Obs:
        return {key: torch.from_numpy(np.ascontiguousarray(value)).unsqueeze(0) for key, value in obs.items()}

    def render(self) -> np.ndarray:
        raise NotImplementedError("a robot env renders no video; record the session's camera topics instead")

    def close(self) -> None:
        self.env.close()


@dataclass
class ActorRobotConfig:
    """The actor's `robot.*`: the goals of a robot episode and how it is scored (`robotrl-actor hardware=...`)."""

    # auto: classifier if hil.reward_classifier, else task where the task scores from what the policy observes
    # (robotrl-record: else operator, a person's success mark)
    reward: str = "auto"  # auto | goal_distance | task | classifier | operator
    goal: dict[str, list[float]] = field(default_factory=dict)  # fixed goals, e.g. +robot.goal.target=[0.5,0,0.3]
    goal_range: dict[str, list[list[float]]] = field(default_factory=dict)  # per-episode boxes; {}: the task's draw
    # The learner's deploy spec (its run directory, or the deploy_spec.json in it; robotrl/core/deploy_spec.py).
    # null: made from the task config, nothing simulated, which serves every task but those holding points whose
    # offsets are measured in simulation (peg_insert's peg tip)
    deploy_spec: str | None = None

    def validate(self) -> None:
        if self.reward not in ("auto", *REWARDS):
            raise ValueError(f"robot.reward must be one of auto, {', '.join(REWARDS)}, got {self.reward!r}")
        for key, box in self.goal_range.items():
            goal_box(f"robot.goal_range.{key}", box)


def robot_deploy_spec(task_cfg, frame_stack: int, robot: ActorRobotConfig) -> DeploySpec:
    """The deploy spec an actor on a robot runs, its agent stacking `frame_stack` camera frames: `robot.deploy_spec`
    (the learner's), checked against this actor's task config, or, without one, the task's own made from the
    config (nothing simulated)."""
    held_sites = task_class(task_cfg.name).held_sites if hasattr(task_cfg, "name") else ()
    if robot.deploy_spec is None:
        if held_sites:
            raise ValueError(
                f"task {task_cfg.name!r} observes points the tool holds ({list(held_sites)}), whose offsets are "
                "measured in simulation when a run starts: give robot.deploy_spec=<the learner's run directory>"
            )
        return deploy_spec_for(task_cfg, frame_stack)
    spec = read_deploy_spec(robot.deploy_spec)
    own = task_class(task_cfg.name).deploy_spec(task_cfg, frame_stack, {k: list(v) for k, v in spec.held.items()})
    differ = [f.name for f in dataclasses.fields(DeploySpec) if getattr(spec, f.name) != getattr(own, f.name)]
    if differ:
        raise ValueError(
            f"robot.deploy_spec={robot.deploy_spec}: it differs from this actor's task config in {differ}; run the "
            "learner's task config here"
        )
    return spec


def make_robot_vec_env(
    task_cfg, frame_stack: int, hardware, robot: ActorRobotConfig, classifier: bool, stop: threading.Event | None = None
) -> RobotVecEnv:
    """The robot as the simulated task `task_cfg` sees it, for an agent stacking `frame_stack` camera frames, from
    the task's deploy spec (`robot_deploy_spec`: nothing simulated is built). `classifier`: a learned reward
    classifier will wrap the env (hil.reward_classifier); `stop`: the actor's (or the recording's)."""
    # lazy (start-up time): the robot env loads MuJoCo (kinematics) and the bridge; this module is the actor's
    # config in simulation too
    from robotrl.hardware.deploy import make_robot_env

    robot.validate()
    spec = robot_deploy_spec(task_cfg, frame_stack, robot)
    obs_spec = spec.obs_spec()
    score = task_functions(spec).score
    # the task's own reward where the policy observes every entry it reads (not a pixel policy)
    scorable = spec.scores_from_observations
    kind = "task" if robot.reward == "goal_distance" else robot.reward  # reach's rule, under its older name
    if kind == "auto":
        kind = "classifier" if classifier else "task"
    if kind == "classifier" and not classifier:
        raise ValueError("robot.reward=classifier needs hil.reward_classifier=<robotrl-train-classifier output dir>")
    if kind == "task" and not scorable:
        why = (
            f"its reward reads {list(spec.score_reads)}, which this policy does not all observe"
            if spec.score_reads
            else "its reward needs state no observation holds (the fingers' contacts)"
        )
        raise ValueError(
            f"task {task_cfg.name!r} cannot be scored on a robot from its observation: {why}; give "
            "hil.reward_classifier=<dir> (a classifier on camera frames)"
        )
    given = {k: [list(map(float, b)) for b in v] for k, v in robot.goal_range.items()}
    goal_range = dict(given)  # the rest the robot env draws at each reset as the task does (reach, push)
    goal = {k: list(v) for k, v in robot.goal.items()}
    for key in [*given, *goal]:
        if key not in obs_spec:
            part = "goal_range" if key in given else "goal"
            raise ValueError(
                f"robot.{part}.{key}: task {task_cfg.name!r} observes no {key!r} (it observes {sorted(obs_spec)})"
            )
        if key in given and (len(given[key][0]),) != tuple(obs_spec[key].shape):
            raise ValueError(
                f"robot.goal_range.{key} has corners of {len(given[key][0])} values, the task observes {key!r} "
                f"as {tuple(obs_spec[key].shape)}"
            )
    for key, (low, high) in goal_range.items():  # a placeholder until reset() draws the first one
        goal.setdefault(key, [(a + b) / 2 for a, b in zip(low, high, strict=True)])
    env = make_robot_env(hardware, spec, goal, goal_option="robot.goal")
    reward = RobotRewardConfig(
        kind=kind,
        reads=list(spec.score_reads),
        # with a classifier, its verdict ends episodes (hil/reward_classifier.py), not the task's rule
        terminate_on_success=bool(getattr(task_cfg, "terminate_on_success", False)) and kind != "classifier",
        goal_range={k: v for k, v in goal_range.items() if k not in robot.goal},
    )
    try:
        return RobotVecEnv(env, reward, score, stop)
    except Exception:
        env.close()
        raise
