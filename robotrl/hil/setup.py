"""Assembles a training run's human-in-the-loop pieces from its `hil.*` config: the env wrappers (learned
reward, takeover) and the demonstrations loaded into the offline buffer."""

from __future__ import annotations

import dataclasses
import logging

from robotrl.core.spec import TensorSpec, pixel_keys
from robotrl.data.dataset import EpisodeDataset
from robotrl.data.lerobot_read import LEROBOT_PREFIX, read_lerobot
from robotrl.data.mixer import add_episode
from robotrl.data.replay import ReplayBuffer
from robotrl.hil.classifier_reward import ClassifierReward, demo_relabeller
from robotrl.hil.config import ROS_OPERATORS, HILConfig
from robotrl.hil.intervention import InterventionEnv, TeleopOperator
from robotrl.hil.reward_classifier import RewardClassifier
from robotrl.hil.scripted_operator import ScriptedOperator, expert_of, world_to_action_of
from robotrl.hil.teleop import make_teleop

log = logging.getLogger(__name__)


def ends_at_success(task_cfg) -> bool:
    """Whether a run's episodes, online and demonstrated, end at their first success: the task's
    `terminate_on_success` (a task config without the setting, gym's, never ends them early)."""
    return bool(getattr(task_cfg, "terminate_on_success", False))


def env_task(task_cfg, hil: HILConfig):
    """The task config to build the env from: with a learned reward the classifier's verdict, not the
    simulator's check, ends episodes (`wrap_for_hil(..., terminate_on_success=...)`), so the env itself runs on
    past its own success; otherwise `task_cfg` as it is."""
    if hil.reward_classifier and ends_at_success(task_cfg):
        return dataclasses.replace(task_cfg, terminate_on_success=False)
    return task_cfg


def wrap_for_hil(env, hil: HILConfig, terminate_on_success: bool = False):
    """`env` with the learned reward (if configured; it ends episodes at its verdict of success if
    `terminate_on_success`, the task's setting) and the operator's takeover (if any)."""
    if hil.reward_classifier:
        classifier = RewardClassifier.load(hil.reward_classifier)
        env = ClassifierReward(env, classifier, terminate_on_success=terminate_on_success)
    if hil.operator == "none":
        return env
    if hil.operator == "scripted":
        operator = ScriptedOperator(expert_of(env), env.num_envs, hil.scripted)
    else:
        if env.num_envs != 1:
            raise ValueError(f"hil.operator={hil.operator} drives one env; num_envs is {env.num_envs}")
        control = getattr(env, "control", None)
        if control not in (None, "ee_delta"):
            # a device's twist read as joint targets would send joints to mid-range (joint_position) or drift
            # the last joint with the gripper value: motions the operator never made
            raise ValueError(
                f"hil.operator={hil.operator} sends end-effector motions, but {env.name!r} is controlled by "
                f"{control}: set task.control=ee_delta"
            )
        operator = TeleopOperator(
            make_teleop(hil.operator, **ros_teleop_options(hil)),
            env.action_dim,
            hil.on_disconnect,
            hil.teleop_gain,
            world_to_action_of(env),
        )
    return InterventionEnv(env, operator)


def ros_teleop_options(hil: HILConfig) -> dict:
    """The topic and domain of a device that listens to ROS 2 (joy, twist); nothing for the others."""
    if hil.operator not in ROS_OPERATORS:
        return {}
    options: dict = {"domain_id": hil.teleop_domain_id}
    if hil.teleop_topic:
        options["topic"] = hil.teleop_topic
    return options


def load_demos(
    paths: list[str],
    offline: ReplayBuffer,
    obs_spec,
    action_dim: int,
    frame_stack: int = 1,
    task: str | None = None,
    reward_classifier: str | None = None,
    reward: str | None = None,
    terminate_on_success: bool = False,
) -> int:
    """Write every episode of the datasets at `paths` into `offline`; returns the transitions written.

    Every dataset is checked against the env (its task where both name one, keys, shapes, dtypes, action
    size, and its reward kind against `reward`, the run's `task.reward`, where both name one) and fully
    verified before any episode of any of them is used: a bad one leaves `offline` as it was. Images are
    recorded one frame per step and stacked here as the env stacks them. With a `reward_classifier` (the
    run's `hil.reward_classifier`), rewards are the classifier's, as online, whatever the demos recorded.
    With `terminate_on_success` (the run's `task.terminate_on_success`) each demonstration ends at its first
    success (the classifier's verdict where one relabels), as a terminal step, as the online episodes do.
    """
    images = pixel_keys(obs_spec)
    expected_reward = None if reward_classifier else reward  # relabelled demos take the classifier's rewards
    loaded = []
    for path in paths:
        dataset = _open_demos(path, obs_spec, action_dim, images, frame_stack)
        _check_compatible(path, dataset, obs_spec, action_dim, images, frame_stack, task, expected_reward)
        loaded.append((path, dataset, dataset.load_all()))
    relabel = None
    if reward_classifier:
        relabel = demo_relabeller(RewardClassifier.load(reward_classifier))
    written = 0
    for path, dataset, episodes in loaded:
        steps = sum(add_episode(offline, e, images, frame_stack, relabel, terminate_on_success) for e in episodes)
        cut = f", {dataset.num_steps - steps} after a first success left out" if steps < dataset.num_steps else ""
        log.info("loaded %d demonstration episodes (%d steps%s) from %s", len(episodes), steps, cut, path)
        written += steps
    if relabel is not None:
        log.info("demonstration rewards are the reward classifier's (%s), as online steps'", reward_classifier)
    return written


def _open_demos(path: str, obs_spec, action_dim: int, images, frame_stack: int):
    """A robotrl dataset, or (`lerobot:<dir>`) a LeRobot one read for this env, one camera frame per step."""
    if not path.startswith(LEROBOT_PREFIX):
        return EpisodeDataset.open(path)
    frame_spec = {
        k: TensorSpec((s.shape[0] // frame_stack, *s.shape[1:]), s.dtype) if k in images else s
        for k, s in obs_spec.items()
    }
    return read_lerobot(path, obs_spec=frame_spec, action_dim=action_dim)


def _check_compatible(path, dataset, obs_spec, action_dim, images, frame_stack, task, reward) -> None:
    recorded_task = dataset.metadata.get("task")
    if task is not None and recorded_task is not None and recorded_task != task:
        raise ValueError(f"dataset {path} was recorded on task {recorded_task!r}, this run trains {task!r}")
    recorded_reward = dataset.metadata.get("reward")
    if reward is not None and recorded_reward is not None and recorded_reward != reward:
        raise ValueError(
            f"dataset {path} was recorded with task.reward={recorded_reward}, this run trains with "
            f"task.reward={reward}: its rewards would not be on the online steps' scale; record the demos "
            f"with task.reward={reward} (or relabel them with hil.reward_classifier)"
        )
    if dataset.action_dim != action_dim:
        raise ValueError(f"dataset {path}: actions have {dataset.action_dim} entries, the task's {action_dim}")
    for key, spec in obs_spec.items():
        if key not in dataset.obs_spec:
            raise ValueError(f"dataset {path}: no observation {key!r} (it has {sorted(dataset.obs_spec)})")
        recorded = tuple(dataset.obs_spec[key].shape)
        expected = tuple(spec.shape)
        if key in images:
            expected = (expected[0] // frame_stack, *expected[1:])
        if recorded != expected:
            raise ValueError(
                f"dataset {path}: observation {key!r} has shape {list(recorded)}, the env's {list(expected)}"
            )
        if dataset.obs_spec[key].dtype != spec.dtype:  # a buffer would cast silently (float images to 0/1)
            raise ValueError(
                f"dataset {path}: observation {key!r} has dtype {dataset.obs_spec[key].dtype}, the env's {spec.dtype}"
            )
