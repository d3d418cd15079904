"""`robotrl-bag-to-dataset bag=<dir> out=<dataset dir> [task=<name>]`: a robotrl-deploy session's bag as an
episode dataset (docs/dataset.md), for behaviour cloning, the reward classifier and system identification.

    robotrl-deploy run=runs/reach hardware=panda episodes=20 record=bags/s1   # the policy's steps are recorded too
    robotrl-bag-to-dataset bag=bags/s1 out=datasets/reach_robot               # appended to where it exists

`robotrl-deploy record=<dir>` writes, beside the bridge's topics, what the policy saw and did at the policy rate
(hardware/deploy.py, `PolicyStepRecorder`), on the topics named here:

    /robotrl/deploy_spec                  std_msgs/String             the policy's deploy spec, as deploy_spec.json
    /robotrl/episode                      std_msgs/String             JSON events: start, end, stale
    /robotrl/action                       std_msgs/Float64MultiArray  the action the robot env was given
    /robotrl/observation/<key>            std_msgs/Float64MultiArray  a state entry, its shape in the layout
                                          sensor_msgs/Image           a camera entry's newest frame, rgb8
    /robotrl/observation/<key>/compressed sensor_msgs/CompressedImage the same frame as PNG (record_compressed)

Every message of one observation is logged at that observation's stamp (ns, wall clock, strictly increasing over
the session), an image's header.stamp too; an action at the stamp of the observation it was computed from; an
event at the stamp of the observation it concerns. So step t of an episode is the observation at stamp s_t, the
action at s_t and the observation at s_(t+1), whatever order the messages are read in.

The conversion reads the bag twice with rosbags (pure Python, no ROS install): first every message of those topics
is checked against the recorded deploy spec and each episode's completeness is decided, so a bag that cannot be
converted is refused before anything is written; then each complete episode is assembled and appended (atomically,
one file each). One dataset episode per recorded episode: the reset's observation, then one step per action.
An episode the bag does not see end (the session stopped mid-episode: Ctrl-C, `duration`), or that lacks a message
(the recorder fell behind), is dropped and reported; one whose observation went stale or whose action came late
(the robot held) ends there as truncated, as `robotrl-actor` cuts it on a robot (hardware/robot_vec_env.py); one
where the policy gave a non-finite action (it raised; nothing was sent) ends truncated before that step. Rewards and
success are the task's own score of each step's next observation where the deploy spec says the task scores from
what the policy observes, else 0 and false (metadata `reward` is then `none`, which a run refuses as demos unless
a reward classifier relabels them); `intervention` is false throughout.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig
from robotrl.tasks import task_functions

from robotrl.cli_errors import reports_errors
from robotrl.config import strict_object
from robotrl.core.deploy_spec import DeploySpec, DeploySpecError
from robotrl.core.spec import TensorSpec
from robotrl.data.dataset import INDEX_FILE, DatasetError, Episode, EpisodeDataset

log = logging.getLogger(__name__)

__all__ = [
    "ACTION_TOPIC",
    "EPISODE_TOPIC",
    "PNG_FORMAT",
    "SPEC_TOPIC",
    "BagToDatasetConfig",
    "compressed_topic",
    "convert",
    "dataset_obs_spec",
    "observation_topic",
    "read_bag",
]

SPEC_TOPIC = "/robotrl/deploy_spec"
EPISODE_TOPIC = "/robotrl/episode"
ACTION_TOPIC = "/robotrl/action"
OBSERVATION_TOPIC = "/robotrl/observation/{key}"
PNG_FORMAT = "rgb8; png compressed bgr8"  # image_transport's compressed format: source encoding; codec; its order
STRING, FLOATS = "std_msgs/msg/String", "std_msgs/msg/Float64MultiArray"
IMAGE, COMPRESSED = "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"
SOURCE = "deploy"  # the episodes' metadata.source


def observation_topic(key: str) -> str:
    return OBSERVATION_TOPIC.format(key=key)


def compressed_topic(key: str) -> str:
    return observation_topic(key) + "/compressed"


def dataset_obs_spec(spec: DeploySpec) -> dict[str, TensorSpec]:
    """The observation spec of the episodes a bag of `spec`'s policy becomes: the policy's entries, each camera
    entry one [3, S, S] frame per step (a run stacks them as its env does, as for every dataset)."""
    obs_spec = {}
    for key, entry in spec.observations.items():
        if entry.source == "camera":
            obs_spec[key] = TensorSpec((3, spec.image_size, spec.image_size), torch.uint8)
        else:
            obs_spec[key] = entry.tensor_spec()
    return obs_spec


def _import_reader():
    # lazy: the optional extra ros (rosbags' reader and its ROS 2 type definitions)
    try:
        from rosbags.rosbag2 import Reader
        from rosbags.typesys import Stores, get_typestore
    except ImportError as error:
        raise ImportError(f'reading a bag needs rosbags: pip install "robotrl[ros]" ({error})') from error
    return Reader, get_typestore(Stores.ROS2_HUMBLE)


def _decode_png(data: np.ndarray, where: str) -> np.ndarray:
    """A PNG frame (PNG_FORMAT: BGR order) as [3, H, W] RGB uint8."""
    try:
        import cv2  # lazy: the optional extra cameras
    except ImportError as error:
        raise ImportError(f"{where} holds PNG frames, decoded with OpenCV: pip install 'robotrl[cameras]'") from error
    frame = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if frame is None:
        raise ValueError(f"{where}: the PNG data does not decode")
    return np.ascontiguousarray(frame[:, :, ::-1].transpose(2, 0, 1))


def _raw_frame(msg: Any) -> np.ndarray:
    """An rgb8 sensor_msgs/Image as [3, H, W] uint8 (rows may be padded to `step` bytes)."""
    rows = np.asarray(msg.data, np.uint8)[: msg.step * msg.height].reshape(msg.height, msg.step)
    return np.ascontiguousarray(rows[:, : msg.width * 3].reshape(msg.height, msg.width, 3).transpose(2, 0, 1))


@dataclass
class EpisodePlan:
    """One complete recorded episode: its observations' stamps (T+1) and how it ended."""

    index: int  # the session's episode number (its start event's)
    stamps: np.ndarray  # int64 [T+1]
    terminated: bool
    truncated: bool
    stale_last: bool  # cut at its last step by a stale observation or a late action: no success there
    checkpoint: str
    note: str = ""  # how it was cut, for the summary


@dataclass
class BagContents:
    """What `read_bag` found: the policy's deploy spec, the topics the episodes come from, the complete episodes
    and those dropped (episode number, why)."""

    bag: Path
    spec: DeploySpec
    session: str  # the deploy spec message's stamp: one per recording
    image_topics: dict[str, str]  # camera entry -> the topic its frames are read from (raw, else compressed)
    episodes: list[EpisodePlan]
    dropped: list[tuple[int, str]] = field(default_factory=list)


def read_bag(bag: str | Path) -> BagContents:
    """Pass one: the bag's policy-step topics checked message by message against its deploy spec, and the episodes
    that can become data. ValueError naming the missing topic or the bad message; FileNotFoundError for no bag."""
    bag = Path(bag)
    if not (bag / "metadata.yaml").is_file():
        what = "has no metadata.yaml (not a rosbag2 bag, or its recording never closed)" if bag.exists() else ""
        raise FileNotFoundError(f"bag={str(bag)!r} {what or 'does not exist'}")
    Reader, typestore = _import_reader()
    with Reader(bag) as reader:
        connections = {c.topic: c for c in reader.connections}
        spec, session = _read_spec(reader, connections, typestore, bag)
        topics = _check_topics(bag, spec, connections)
        image_topics = {key: topic for key, (topic, kind) in topics.items() if kind in (IMAGE, COMPRESSED)}
        stamps: dict[str, list[int]] = {topic: [] for topic, _ in topics.values()}
        stamps[ACTION_TOPIC] = []
        bad_actions: set[int] = set()
        events: list[tuple[int, dict[str, Any]]] = []
        keys = {topic: key for key, (topic, _) in topics.items()}
        wanted = [connections[t] for t in (EPISODE_TOPIC, ACTION_TOPIC, *keys)]
        for connection, stamp, raw in reader.messages(connections=wanted):
            topic = connection.topic
            msg = typestore.deserialize_cdr(raw, connection.msgtype)
            where = f"bag {bag}: {topic} at {stamp} ns"
            if topic == EPISODE_TOPIC:
                events.append((stamp, _event(msg.data, where)))
                continue
            if topic == ACTION_TOPIC:
                if len(msg.data) != spec.action_dim:
                    raise ValueError(
                        f"{where}: an action of {len(msg.data)} values, the policy's has {spec.action_dim}"
                    )
                if not np.isfinite(msg.data).all():
                    bad_actions.add(stamp)
            else:
                _check_observation(msg, connection.msgtype, keys[topic], spec, where)
            stamps[topic].append(stamp)
    arrays = {topic: np.sort(np.asarray(values, np.int64)) for topic, values in stamps.items()}
    plans, dropped = _plan_episodes(events, arrays, [topic for topic, _ in topics.values()], bad_actions)
    return BagContents(bag, spec, session, image_topics, plans, dropped)


def _read_spec(reader, connections, typestore, bag: Path) -> tuple[DeploySpec, str]:
    if SPEC_TOPIC not in connections:
        raise ValueError(
            f"bag {bag} has no topic {SPEC_TOPIC} (the policy's deploy spec, which robotrl-deploy record= writes with "
            f"the policy's steps): it has {sorted(connections)}"
        )
    for connection, stamp, raw in reader.messages(connections=[connections[SPEC_TOPIC]]):
        text = typestore.deserialize_cdr(raw, connection.msgtype).data
        try:
            return DeploySpec.from_json(json.loads(text)), str(stamp)
        except (json.JSONDecodeError, DeploySpecError) as error:
            raise ValueError(f"bag {bag}: {SPEC_TOPIC} holds no valid deploy spec: {error}") from None
    raise ValueError(f"bag {bag}: {SPEC_TOPIC} has no message")


def _check_topics(bag: Path, spec: DeploySpec, connections) -> dict[str, tuple[str, str]]:
    """Each observation entry's topic and message type; ValueError naming the first topic the bag lacks or holds
    with another type."""
    needed = {EPISODE_TOPIC: STRING, ACTION_TOPIC: FLOATS}
    topics = {}
    for key, entry in spec.observations.items():
        topic, kind = observation_topic(key), FLOATS
        if entry.source == "camera":
            kind = IMAGE
            if topic not in connections and compressed_topic(key) in connections:
                topic, kind = compressed_topic(key), COMPRESSED
        topics[key] = (topic, kind)
        needed[topic] = kind
    for topic, kind in needed.items():
        if topic not in connections:
            raise ValueError(
                f"bag {bag} has no topic {topic} ({kind}), which the policy's steps need: it has {sorted(connections)}"
            )
        if connections[topic].msgtype != kind:
            raise ValueError(f"bag {bag}: topic {topic} holds {connections[topic].msgtype}, expected {kind}")
    return topics


def _event(text: str, where: str) -> dict[str, Any]:
    try:
        event = json.loads(text)
    except json.JSONDecodeError:
        event = None
    if not (isinstance(event, dict) and event.get("event") in ("start", "end", "stale")):
        raise ValueError(f"{where}: not an episode event (a JSON object with event start, end or stale): {text!r}")
    needs = {"start": "episode", "end": "steps", "stale": "step"}[event["event"]]
    for name in {"episode", needs}:
        value = event.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}: a {event['event']} event needs {name} as an integer >= 0: {text!r}")
    return event


def _check_observation(msg: Any, kind: str, key: str, spec: DeploySpec, where: str) -> None:
    entry = spec.observations[key]
    if kind == FLOATS:
        if len(msg.data) != math.prod(entry.shape):
            raise ValueError(f"{where}: {len(msg.data)} values, observation {key!r} has shape {list(entry.shape)}")
        return
    size = spec.image_size
    if kind == COMPRESSED:
        if msg.format != PNG_FORMAT:
            raise ValueError(f"{where}: format {msg.format!r}, expected {PNG_FORMAT!r}")
        return
    if (msg.height, msg.width, msg.encoding) != (size, size, "rgb8") or len(msg.data) < msg.step * msg.height:
        raise ValueError(
            f"{where}: a {msg.width}x{msg.height} {msg.encoding} frame of {len(msg.data)} bytes, expected "
            f"{size}x{size} rgb8 (observation {key!r})"
        )


def _plan_episodes(
    events: list[tuple[int, dict[str, Any]]], stamps: dict[str, np.ndarray], observed: list[str], bad_actions: set[int]
) -> tuple[list[EpisodePlan], list[tuple[int, str]]]:
    """The complete episodes (observations and actions at matching stamps, an end event) and the dropped ones."""
    events = sorted(events, key=lambda e: e[0])
    starts = [(stamp, event) for stamp, event in events if event["event"] == "start"]
    plans, dropped = [], []
    for i, (start, event) in enumerate(starts):
        number = event["episode"]
        stop = starts[i + 1][0] if i + 1 < len(starts) else np.iinfo(np.int64).max
        inside = [(stamp, e) for stamp, e in events if start <= stamp < stop and e.get("episode") == number]
        ends = [(stamp, e) for stamp, e in inside if e["event"] == "end"]
        reference = _between(stamps[observed[0]], start, stop)
        if not ends:
            last = i + 1 == len(starts)
            where = "the bag ends" if last else "the next episode starts"
            dropped.append((number, f"{where} before it ended ({max(len(reference) - 1, 0)} steps recorded)"))
            continue
        end, end_event = ends[0]
        obs_stamps = _between(stamps[observed[0]], start, end + 1)
        problem = None
        if len(obs_stamps) != end_event["steps"] + 1 or obs_stamps[0] != start or obs_stamps[-1] != end:
            problem = f"{observed[0]} has {len(obs_stamps)} observations, the episode {end_event['steps']} steps"
        for topic in observed[1:]:
            if problem is None and not np.array_equal(_between(stamps[topic], start, end + 1), obs_stamps):
                problem = f"{topic} lacks messages at some of its {len(obs_stamps)} observations"
        if problem is None and not np.array_equal(_between(stamps[ACTION_TOPIC], start, end + 1), obs_stamps[:-1]):
            problem = f"{ACTION_TOPIC} lacks messages at some of its {len(obs_stamps) - 1} steps"
        if problem is not None:
            dropped.append((number, f"incomplete: {problem} (the recorder fell behind?)"))
            continue
        plan = EpisodePlan(
            number,
            obs_stamps,
            bool(end_event.get("terminated", False)),
            bool(end_event.get("truncated", False)),
            False,
            str(event.get("checkpoint", "")),
        )
        _cut(plan, inside, bad_actions)
        if len(plan.stamps) < 2:
            dropped.append((number, plan.note))
        else:
            plans.append(plan)
    return plans, dropped


def _between(stamps: np.ndarray, low: int, high: int) -> np.ndarray:
    return stamps[np.searchsorted(stamps, low, "left") : np.searchsorted(stamps, high, "left")]


def _cut(plan: EpisodePlan, events: list[tuple[int, dict[str, Any]]], bad_actions: set[int]) -> None:
    """End `plan` early where the robot did not do what a step claims: at the first step whose observation was
    stale or whose action was late (kept, truncated, no success: the actor's rule), or before the first non-finite
    action (nothing was sent)."""
    steps = len(plan.stamps) - 1
    position = {int(s): i for i, s in enumerate(plan.stamps)}
    stale = sorted(position[s] - 1 for s, e in events if e["event"] == "stale" and position.get(s, 0) >= 1)
    nan = next((i for i, s in enumerate(plan.stamps[:-1]) if int(s) in bad_actions), None)
    length, note, stale_last = steps, "", False
    if stale and stale[0] + 1 < length:
        length, stale_last = stale[0] + 1, True
        reason = next(e.get("reason", "") for s, e in events if e["event"] == "stale" and position.get(s) == length)
        note = f"cut at step {stale[0]} of {steps}: {reason or 'stale observation or late action'}"
    elif stale and stale[0] + 1 == length:
        stale_last = True
        note = "its last step's observation was stale or its action late"
    if nan is not None and nan < length:
        length, stale_last = nan, False
        note = f"cut before step {nan} of {steps}: the policy gave no finite action (it raised)"
    if length < steps or stale_last:
        plan.stamps, plan.stale_last, plan.note = plan.stamps[: length + 1], stale_last, note
        plan.terminated, plan.truncated = plan.terminated and length == steps, True


def episodes(contents: BagContents) -> Iterator[tuple[EpisodePlan, Episode]]:
    """Pass two: each complete episode of `contents` assembled, scored and validated, in the session's order."""
    spec, bag = contents.spec, contents.bag
    obs_spec = dataset_obs_spec(spec)
    score = task_functions(spec).score if spec.scores_from_observations else None
    state_keys = [k for k in obs_spec if k not in contents.image_topics]
    topics = {observation_topic(k): k for k in state_keys}
    topics.update({topic: key for key, topic in contents.image_topics.items()})
    Reader, typestore = _import_reader()
    with Reader(bag) as reader:
        wanted = [c for c in reader.connections if c.topic in topics or c.topic == ACTION_TOPIC]
        for plan in contents.episodes:
            length = len(plan.stamps) - 1
            position = {int(s): i for i, s in enumerate(plan.stamps)}
            obs = {
                k: np.zeros((length + 1, *s.shape), np.uint8 if s.dtype == torch.uint8 else np.float32)
                for k, s in obs_spec.items()
            }
            filled = {k: np.zeros(length + 1, bool) for k in obs_spec}
            action = np.zeros((length, spec.action_dim), np.float32)
            acted = np.zeros(length, bool)
            start, stop = int(plan.stamps[0]), int(plan.stamps[-1]) + 1
            for connection, stamp, raw in reader.messages(connections=wanted, start=start, stop=stop):
                i = position.get(stamp)
                if i is None:
                    continue
                msg = typestore.deserialize_cdr(raw, connection.msgtype)
                if connection.topic == ACTION_TOPIC:
                    if i < length:
                        action[i], acted[i] = np.clip(msg.data, -1.0, 1.0), True
                    continue
                key = topics[connection.topic]
                if connection.msgtype == FLOATS:
                    obs[key][i] = np.asarray(msg.data).reshape(obs_spec[key].shape)
                elif connection.msgtype == IMAGE:
                    obs[key][i] = _raw_frame(msg)
                else:
                    obs[key][i] = _decode_png(msg.data, f"bag {bag}: {connection.topic} at {stamp} ns")
                filled[key][i] = True
            lacking = [k for k, f in filled.items() if not f.all()] + ([ACTION_TOPIC] if not acted.all() else [])
            if lacking:  # read_bag saw them all: the bag changed between the passes
                raise ValueError(f"bag {bag}: episode {plan.index} lacks messages of {lacking} on a second reading")
            yield plan, _episode(plan, obs, action, score, spec, contents)


def _episode(plan: EpisodePlan, obs: dict[str, np.ndarray], action: np.ndarray, score, spec, contents) -> Episode:
    length = len(action)
    tensors = {k: torch.from_numpy(v) for k, v in obs.items()}
    reward, success = torch.zeros(length), torch.zeros(length, dtype=torch.bool)
    if score is not None:  # each step's reward from its next observation, as the actor scores a robot's steps
        reward, success = score({k: v[1:] for k, v in tensors.items() if v.dtype == torch.float32})
        reward, success = reward.reshape(length).float(), success.reshape(length).bool()
    if plan.stale_last:
        success = success.clone()
        success[-1] = False
    last = torch.arange(length) == length - 1
    episode = Episode(
        obs=tensors,
        action=torch.from_numpy(action),
        reward=reward.contiguous(),
        terminated=last & plan.terminated,
        truncated=last & (plan.truncated and not plan.terminated),
        success=success,
        intervention=torch.zeros(length, dtype=torch.bool),
        metadata={
            "source": SOURCE,
            "task": spec.task,
            "robot": spec.robot,
            "checkpoint": plan.checkpoint,
            "bag": contents.bag.name,
            "session": contents.session,
            "bag_episode": str(plan.index),
        },
    )
    episode.validate(dataset_obs_spec(spec), spec.action_dim)
    return episode


def _sessions_in(dataset: EpisodeDataset) -> set[str]:
    """The bag sessions the dataset's episodes came from, read from each file's header alone."""
    sessions = set()
    for entry in dataset.entries:
        with open(dataset.root / entry.file, "rb") as file:
            size = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(size))
        metadata = header.get("__metadata__") or {}
        if metadata.get("source") == SOURCE and "session" in metadata:
            sessions.add(metadata["session"])
    return sessions


def convert(bag: str | Path, out: str | Path, task: str | None = None) -> dict[str, Any]:
    """Convert `bag` (robotrl-deploy record=) into the episode dataset at `out`, created or appended to; the
    summary: episodes written and dropped (each with why), steps, how rewards were given."""
    contents = read_bag(bag)
    spec = contents.spec
    if task is not None and task != spec.task:
        raise ValueError(f"task={task!r}: the bag's policy was trained on task {spec.task!r}")
    scored = spec.scores_from_observations and task_functions(spec).score is not None
    reward = spec.task_config.get("reward") if scored else "none"  # a task's reward variant (dense, sparse)
    metadata = {"task": spec.task, **({"reward": str(reward)} if reward is not None else {})}
    out = Path(out)
    written: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"bag": str(contents.bag), "out": str(out), "task": spec.task}
    summary.update(scored=scored, reward=metadata.get("reward"))  # scored: the task's own score of each step
    for number, why in contents.dropped:
        log.warning("bag %s: episode %d dropped: %s", contents.bag, number, why)
    if contents.episodes or (out / INDEX_FILE).exists():
        try:  # obs spec, action_dim, task and reward kind must match an existing dataset's
            dataset = EpisodeDataset.create(out, dataset_obs_spec(spec), spec.action_dim, metadata, exist_ok=True)
        except DatasetError as error:
            raise DatasetError(error.path, f"cannot append bag {contents.bag}: {error.problem}") from None
        if contents.session in _sessions_in(dataset):
            raise DatasetError(
                out / INDEX_FILE,
                f"holds episodes of bag {contents.bag} already (session {contents.session}): converting it again "
                "would add them twice",
            )
        try:
            for plan, episode in episodes(contents):
                path = dataset.append(episode)
                written.append({"episode": plan.index, "steps": len(episode), "success": episode.success_any})
                if plan.note:
                    written[-1]["note"] = plan.note
                log.info("bag episode %d -> %s (%d steps)", plan.index, path.relative_to(out), len(episode))
        except Exception:
            log.error("bag %s: %d of its episodes were appended to %s before this error", bag, len(written), out)
            raise
    summary.update(
        episodes=len(written),
        steps=sum(e["steps"] for e in written),
        written=written,
        dropped=[{"episode": n, "why": why} for n, why in contents.dropped],
    )
    return summary


@dataclass
class BagToDatasetConfig:
    bag: str = MISSING  # a rosbag2 directory written by robotrl-deploy record=
    out: str = MISSING  # the episode dataset to create, or to append to (same obs spec, action_dim, task, reward)
    task: str | None = None  # null: the recorded policy's task; given, it must be that task


def register_config() -> None:
    """The schema, and the config that runs it with no output directory or log file (the summary is printed)."""
    store = ConfigStore.instance()
    store.store(name="bag_to_dataset_schema", node=BagToDatasetConfig)
    store.store(
        name="bag_to_dataset",
        node={
            "defaults": ["bag_to_dataset_schema", {"override hydra/job_logging": "stdout"}, "_self_"],
            "hydra": {"run": {"dir": "."}, "output_subdir": None, "job": {"chdir": False}},
        },
    )


def main() -> None:
    register_config()

    @hydra.main(version_base="1.3", config_path=None, config_name="bag_to_dataset")
    @reports_errors("robotrl-bag-to-dataset")
    def _hydra_main(cfg: DictConfig) -> None:
        config: BagToDatasetConfig = strict_object(BagToDatasetConfig, cfg)
        print(json.dumps({"bag_to_dataset": convert(config.bag, config.out, config.task)}), flush=True)

    _hydra_main()


if __name__ == "__main__":
    main()
