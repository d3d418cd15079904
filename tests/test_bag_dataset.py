"""A deployment bag becomes an episode dataset: robotrl-deploy records what the policy saw and did
(hardware/deploy.py: PolicyStepRecorder) and robotrl-bag-to-dataset converts it (hardware/bag_dataset.py).

The end-to-end test deploys a state+pixels policy on the simulated twin over DDS on loopback (domain id 226),
the robot env's observations and actions captured as it hands them over, and checks the dataset against them
step for step; rosbags (an independent reader of ROS 2 CDR) reads every message back. The other tests drive the
recorder's writers directly with real messages: cut and dropped episodes, a missing topic, appending, the
console script, and what recording costs the policy loop with full-resolution frames.
"""

import dataclasses
import json
import threading
import time

import numpy as np
import pytest
import torch
from helpers import run_module, untrained_run

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')
pytest.importorskip("rosbags", reason='needs the ros extra: pip install "robotrl[ros]"')

from robotrl.hardware import deploy
from robotrl.hardware.bag_dataset import (
    ACTION_TOPIC,
    EPISODE_TOPIC,
    SPEC_TOPIC,
    compressed_topic,
    convert,
    dataset_obs_spec,
    observation_topic,
    read_bag,
)
from robotrl.hardware.bag_recording import BagRecorder, PolicyStepRecorder
from robotrl.hardware.deploy import DeployConfig
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig
from robotrl.tasks import TASK_CONFIGS, deploy_spec_for
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from robotrl.config import register_configs
from robotrl.core.deploy_spec import ObsEntry
from robotrl.core.spec import TensorSpec
from robotrl.data.dataset import DatasetError, EpisodeDataset
from robotrl.runtime.frame_stack import fresh_stack, push_frame

register_configs()
HUMBLE = get_typestore(Stores.ROS2_HUMBLE)
RATE = 250.0
DOMAIN = 226


def _reach_spec(obs: str = "state", image_size: int = 64, frame_stack: int = 1):
    task = TASK_CONFIGS["panda_reach"](name="panda_reach", obs=obs, image_size=image_size)
    return deploy_spec_for(task, frame_stack)


def _observation(spec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """An observation as the robot env gives one: float32 state entries, uint8 [3k, S, S] camera entries."""
    obs = {}
    for key, entry in spec.observations.items():
        if entry.source == "camera":
            obs[key] = rng.integers(0, 256, entry.shape, dtype=np.uint8)
        else:
            obs[key] = rng.normal(size=entry.shape).astype(np.float32)
    return obs


def _record(path, spec, episodes, compressed: bool = False):
    """Record `episodes` as robotrl-deploy does: each a list of steps after a reset observation, a step being
    (action, observation, info); an episode whose last item is "stop" is left without its end, as a session
    stopped mid-episode leaves it. Returns what was given, per episode: (observations, actions)."""
    recorder = BagRecorder(None, path, {})  # no bridge topics: only the policy's steps
    steps_log = PolicyStepRecorder(recorder, spec, "step_000000100", compressed)
    sent = []
    try:
        for number, (reset_obs, steps) in enumerate(episodes):
            steps_log.start(number, reset_obs)
            observations, actions = [reset_obs], []
            for step in steps:
                if step == "stop":
                    break
                action, obs, info = step
                steps_log.step(action, obs, info)
                observations.append(obs)
                actions.append(action)
            else:
                steps_log.end(False, True)
            sent.append((observations, actions))
    finally:
        steps_log.close()
        recorder.close()
    assert steps_log.dropped == 0 and steps_log.failed == 0
    return sent


def _episode_steps(spec, rng, length: int, infos: dict[int, dict] | None = None, nan_at: int | None = None):
    steps = []
    for t in range(length):
        action = rng.uniform(-1, 1, spec.action_dim).astype(np.float32)
        if t == nan_at:
            action[:] = np.nan
        steps.append((action, _observation(spec, rng), (infos or {}).get(t, {"stale_observation": 0})))
    return _observation(spec, rng), steps


def _copy_bag(source, dest, keep, change=None) -> None:
    """A copy of `source` with only the messages `keep(topic, index)` accepts (as `ros2 bag convert` filters), each
    message's bytes replaced by `change(topic, index, raw)` where given."""
    seen: dict[str, int] = {}
    with Reader(source) as reader, Writer(dest, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        out = {}
        for connection in reader.connections:
            if keep(connection.topic, None):
                out[connection.id] = writer.add_connection(connection.topic, connection.msgtype, typestore=HUMBLE)
        for connection, stamp, raw in reader.messages():
            index = seen[connection.topic] = seen.get(connection.topic, -1) + 1
            if connection.id in out and keep(connection.topic, index):
                writer.write(out[connection.id], stamp, change(connection.topic, index, raw) if change else raw)


def test_stale_steps_and_policy_errors_cut_episodes_and_an_unended_one_is_dropped(tmp_path):
    spec = _reach_spec()
    rng = np.random.default_rng(0)
    stale = {1: {"stale_observation": 1, "stale_reason": "joint_states 80.0 ms old"}}
    late = {3: {"stale_observation": 0, "late_action": 1, "late_reason": "joint state is 95.0 ms old"}}
    whole = _episode_steps(spec, rng, 4)
    whole[1][-1][1]["ee_pos"] = whole[1][-1][1]["target"].copy()  # at the target after its last step
    episodes = [
        whole,
        _episode_steps(spec, rng, 4, stale),  # cut after step 1, truncated there
        _episode_steps(spec, rng, 4, nan_at=2),  # the policy raised at step 2: cut before it
        _episode_steps(spec, rng, 3, nan_at=0),  # nothing before the failure: dropped
        _episode_steps(spec, rng, 4, late),  # its last step's action came late: kept, no success there
    ]
    episodes[4][1][-1][1]["ee_pos"] = episodes[4][1][-1][1]["target"].copy()
    last = _episode_steps(spec, rng, 3)
    episodes.append((last[0], [*last[1][:2], "stop"]))  # Ctrl-C after two steps
    sent = _record(tmp_path / "bag", spec, episodes)

    summary = convert(tmp_path / "bag", tmp_path / "data")
    assert summary["scored"] and summary["reward"] == "dense" and summary["task"] == "panda_reach"
    assert [(w["episode"], w["steps"]) for w in summary["written"]] == [(0, 4), (1, 2), (2, 2), (4, 4)]
    assert "joint_states 80.0 ms old" in summary["written"][1]["note"]
    assert "no finite action" in summary["written"][2]["note"]
    dropped = {d["episode"]: d["why"] for d in summary["dropped"]}
    assert set(dropped) == {3, 5} and "no finite action" in dropped[3]
    assert dropped[5] == "the bag ends before it ended (2 steps recorded)"

    dataset = EpisodeDataset.open(tmp_path / "data")
    assert dataset.obs_spec == spec.obs_spec() and dataset.action_dim == spec.action_dim
    assert dataset.metadata == {"task": "panda_reach", "reward": "dense"}
    for episode, (number, length) in zip(dataset, [(0, 4), (1, 2), (2, 2), (4, 4)], strict=True):
        observations, actions = sent[number]
        assert len(episode) == length and episode.metadata["bag_episode"] == str(number)
        assert episode.metadata["source"] == "deploy" and episode.metadata["checkpoint"] == "step_000000100"
        for key in spec.observations:  # float32 through float64 on the wire: exact
            assert torch.equal(
                episode.obs[key], torch.from_numpy(np.stack([o[key] for o in observations[: length + 1]]))
            )
        assert torch.equal(episode.action, torch.from_numpy(np.stack(actions[:length])))
        assert episode.truncated.tolist() == [False] * (length - 1) + [True] and not episode.terminated.any()
        assert not episode.intervention.any()
        distance = (episode.obs["ee_pos"][1:] - episode.obs["target"][1:]).norm(dim=-1)
        torch.testing.assert_close(episode.reward, -distance)  # reach's dense reward of each next observation
    assert dataset.load(0).success.tolist() == [False, False, False, True]  # reach's own success
    assert dataset.entries[0].success and not dataset.entries[3].success  # a late action's step claims none
    assert dataset.load(3).reward[-1] == 0.0  # its reward stays the score's


def test_frames_round_trip_raw_and_png_and_rosbags_reads_every_message(tmp_path):
    spec = _reach_spec("state+pixels", 64, frame_stack=3)
    rng = np.random.default_rng(1)
    sent = _record(tmp_path / "bag", spec, [_episode_steps(spec, rng, 3), _episode_steps(spec, rng, 2)], True)
    frames = {}
    with AnyReader([tmp_path / "bag"], default_typestore=HUMBLE) as reader:  # the bag's own definitions too
        types = {c.topic: c.msgtype for c in reader.connections}
        for connection, stamp, raw in reader.messages():
            msg = reader.deserialize(raw, connection.msgtype)
            if connection.msgtype in ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"):
                assert msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == stamp
                assert msg.header.frame_id == "front"
                frames.setdefault(connection.topic, []).append(msg)
            elif connection.topic in (ACTION_TOPIC, observation_topic("arm_qpos")):  # the layout names the entry
                dims = [(d.label, d.size, d.stride) for d in msg.layout.dim]
                assert dims == ([("action", 3, 3)] if connection.topic == ACTION_TOPIC else [("arm_qpos", 7, 7)])
    assert types[observation_topic("pixels_front")] == "sensor_msgs/msg/Image"
    assert types[compressed_topic("pixels_front")] == "sensor_msgs/msg/CompressedImage"
    assert types[SPEC_TOPIC] == types[EPISODE_TOPIC] == "std_msgs/msg/String"
    assert types[ACTION_TOPIC] == types[observation_topic("arm_qpos")] == "std_msgs/msg/Float64MultiArray"
    newest = [obs["pixels_front"][-3:] for observations, _ in sent for obs in observations]
    raw = [m.data.reshape(64, 64, 3).transpose(2, 0, 1) for m in frames[observation_topic("pixels_front")]]
    assert len(raw) == len(newest) == 7 and all(np.array_equal(a, b) for a, b in zip(raw, newest, strict=True))
    assert all(m.format == "rgb8; png compressed bgr8" for m in frames[compressed_topic("pixels_front")])

    convert(tmp_path / "bag", tmp_path / "raw")
    # a bag keeping only the PNG frames (filtered after the session) converts to the same pixels
    _copy_bag(tmp_path / "bag", tmp_path / "png", lambda topic, _: topic != observation_topic("pixels_front"))
    assert read_bag(tmp_path / "png").image_topics == {"pixels_front": compressed_topic("pixels_front")}
    convert(tmp_path / "png", tmp_path / "from_png")
    from_raw, from_png = EpisodeDataset.open(tmp_path / "raw"), EpisodeDataset.open(tmp_path / "from_png")
    assert from_raw.obs_spec["pixels_front"] == TensorSpec((3, 64, 64), torch.uint8)  # one frame per step
    for a, b, (observations, _) in zip(from_raw, from_png, sent, strict=True):
        expected = np.stack([obs["pixels_front"][-3:] for obs in observations])  # each observation's newest frame
        assert np.array_equal(a.obs["pixels_front"].numpy(), expected)
        assert torch.equal(a.obs["pixels_front"], b.obs["pixels_front"])


def test_a_missing_topic_or_message_is_named_and_nothing_is_written(tmp_path):
    spec = _reach_spec()
    rng = np.random.default_rng(2)
    _record(tmp_path / "bag", spec, [_episode_steps(spec, rng, 3), _episode_steps(spec, rng, 3)])
    # a bag from before the policy's steps were recorded (joint states and commands only)
    BagRecorder(None, tmp_path / "old", {}).close()
    with pytest.raises(ValueError, match="has no topic /robotrl/deploy_spec"):
        convert(tmp_path / "old", tmp_path / "out")
    for topic in (observation_topic("ee_pos"), ACTION_TOPIC, EPISODE_TOPIC):
        filtered = tmp_path / topic.replace("/", "_")
        _copy_bag(tmp_path / "bag", filtered, lambda t, _, topic=topic: t != topic)
        with pytest.raises(ValueError, match=f"has no topic {topic} "):
            convert(filtered, tmp_path / "out")
    # a message that does not fit the recorded spec (ee_pos with 4 values) is named, with its topic and stamp
    floats = HUMBLE.types["std_msgs/msg/Float64MultiArray"]
    wrong = bytes(
        HUMBLE.serialize_cdr(
            floats(layout=HUMBLE.types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0), data=np.zeros(4)),
            "std_msgs/msg/Float64MultiArray",
        )
    )
    ee_pos = observation_topic("ee_pos")
    _copy_bag(
        tmp_path / "bag",
        tmp_path / "wrong",
        lambda t, _: True,
        lambda t, i, raw: wrong if t == ee_pos and i == 2 else raw,
    )
    with pytest.raises(
        ValueError, match=r"/robotrl/observation/ee_pos at \d+ ns: 4 values, observation 'ee_pos' has shape \[3\]"
    ):
        convert(tmp_path / "wrong", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # one observation message lost (a recorder that fell behind): that episode is dropped, the other kept
    _copy_bag(tmp_path / "bag", tmp_path / "gap", lambda t, i: t != observation_topic("arm_qvel") or i != 5)
    summary = convert(tmp_path / "gap", tmp_path / "out")
    assert [w["episode"] for w in summary["written"]] == [0]
    assert (
        summary["dropped"][0]["episode"] == 1 and "/robotrl/observation/arm_qvel lacks" in summary["dropped"][0]["why"]
    )


def test_appends_only_to_a_matching_dataset_and_never_the_same_bag_twice(tmp_path):
    spec = _reach_spec()
    rng = np.random.default_rng(3)
    for name in ("a", "b"):
        _record(tmp_path / name, spec, [_episode_steps(spec, rng, 2)])
    other = {**spec.obs_spec(), "ee_pos": TensorSpec((4,), torch.float32)}
    EpisodeDataset.create(tmp_path / "other", other, spec.action_dim)
    with pytest.raises(DatasetError, match=r"cannot append bag .*obs_spec\['ee_pos'\] differs"):
        convert(tmp_path / "a", tmp_path / "other")
    EpisodeDataset.create(tmp_path / "wide", spec.obs_spec(), spec.action_dim + 1)
    with pytest.raises(DatasetError, match="action_dim differs: the dataset has 4, asked 3"):
        convert(tmp_path / "a", tmp_path / "wide")
    sparse = EpisodeDataset.create(
        tmp_path / "sparse", spec.obs_spec(), spec.action_dim, {"task": "panda_reach", "reward": "sparse"}
    )
    with pytest.raises(DatasetError, match=r"metadata\['reward'\] differs"):
        convert(tmp_path / "a", sparse.root)
    assert len(EpisodeDataset.open(tmp_path / "other")) == 0

    convert(tmp_path / "a", tmp_path / "data")
    convert(tmp_path / "b", tmp_path / "data")
    assert len(EpisodeDataset.open(tmp_path / "data")) == 2
    with pytest.raises(DatasetError, match=r"holds episodes of bag .* already"):
        convert(tmp_path / "a", tmp_path / "data")
    with pytest.raises(ValueError, match="task='panda_push': the bag's policy was trained on task 'panda_reach'"):
        convert(tmp_path / "a", tmp_path / "data2", task="panda_push")
    assert len(EpisodeDataset.open(tmp_path / "data")) == 2


def test_the_console_script_prints_its_summary_and_one_line_errors(tmp_path):
    spec = _reach_spec()
    _record(tmp_path / "bag", spec, [_episode_steps(spec, np.random.default_rng(4), 2)])
    proc = run_module("robotrl.hardware.bag_dataset", f"bag={tmp_path / 'bag'}", f"out={tmp_path / 'data'}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["bag_to_dataset"]
    assert summary["episodes"] == 1 and summary["steps"] == 2 and summary["dropped"] == []
    proc = run_module("robotrl.hardware.bag_dataset", f"bag={tmp_path / 'nope'}", "out=x", check=False)
    assert proc.returncode == 1 and "robotrl-bag-to-dataset: error: bag=" in proc.stderr
    assert "does not exist" in proc.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("size", "compressed", "writer_budget_ms"),
    [(640, False, 40.0), (128, True, 40.0), (640, True, None)],
    ids=["640px-raw", "128px-raw+png", "640px-raw+png"],
)
def test_recording_never_stalls_the_policy_loop(tmp_path, size, compressed, writer_budget_ms):
    """25 steps at 25 Hz: the loop only queues a copy of each frame (640x640 has more pixels than 640x480) and the
    writer thread builds, encodes and writes; it keeps up with the policy rate (40 ms a step) where the margin
    allows a loaded 2-core machine to say so (a 640x640 PNG takes 20-35 ms there: printed, docs/hardware.md)."""
    spec = _reach_spec("state+pixels")
    camera = ObsEntry((3, size, size), "camera", dtype="uint8", of="front")
    spec = dataclasses.replace(spec, image_size=size, observations={**spec.observations, "pixels_front": camera})
    spec.validate()
    recorder = BagRecorder(None, tmp_path / "bag", {})
    steps_log = PolicyStepRecorder(recorder, spec, compressed=compressed)
    y, x = np.mgrid[0:size, 0:size]
    rng = np.random.default_rng(5)
    # smooth scenes with a camera's noise (3 levels): neither a flat image nor random bytes
    scenes = [np.stack([(x + 7 * t) % 256, (y + 3 * t) % 256, (x + y) // 5 % 256]) for t in range(5)]
    frames = [np.clip(scene + rng.normal(0, 3, scene.shape), 0, 255).astype(np.uint8) for scene in scenes]
    try:
        obs = _observation(spec, rng)
        steps_log.start(0, obs)
        tick = time.monotonic()
        for t in range(25):
            obs = dict(obs, pixels_front=frames[t % len(frames)])
            steps_log.step(rng.uniform(-1, 1, 3), obs, {"stale_observation": 0})
            tick += 0.04
            time.sleep(max(0.0, tick - time.monotonic()))
        steps_log.end(False, True)
    finally:
        steps_log.close()
        recorder.close()
    timing = steps_log.timing()
    print(json.dumps({f"recording_{size}px_{'raw+png' if compressed else 'raw'}_25hz": timing}))
    assert steps_log.dropped == 0 and steps_log.failed == 0 and timing["writer_ms"]["steps"] == 26
    assert timing["loop_ms"]["mean"] < 2.0, timing  # a copy of the frame and a queue put
    if writer_budget_ms is not None:
        assert timing["writer_ms"]["mean"] < writer_budget_ms, timing
    convert(tmp_path / "bag", tmp_path / "data")
    episode = EpisodeDataset.open(tmp_path / "data").load(0)
    assert len(episode) == 25 and torch.equal(episode.obs["pixels_front"][-1], torch.from_numpy(obs["pixels_front"]))


# ---- on the twin, over DDS on loopback ---------------------------------------------------------------------


@pytest.mark.dds
def test_a_deployment_on_the_twin_becomes_a_dataset_step_for_step(tmp_path, monkeypatch):
    """robotrl-deploy's own loop records a state+pixels policy on the twin for two whole episodes and a third
    stopped after three steps; the dataset holds the first two exactly as the robot env handed them over."""
    overrides = ["task=panda_reach", "task.obs=state+pixels", "task.cameras=[front]", "task.image_size=64"]
    run_dir = untrained_run(tmp_path / "run", [*overrides, "agent=drqv2_light"])
    stop = threading.Event()
    given: list[list] = []  # per episode: [reset obs, (action, obs, info), ...] as the robot env saw them
    make_robot_env, load_policy = deploy.make_robot_env, deploy.load_policy

    def warmed(*args):  # a first convolution takes long enough to make the first action late on a busy machine
        agent, spec, checkpoint = load_policy(*args)
        with torch.no_grad():
            agent.act({k: torch.zeros(1, *s.shape, dtype=s.dtype) for k, s in spec.obs_spec().items()}, True)
        return agent, spec, checkpoint

    def watched(*args, **kwargs):
        env = make_robot_env(*args, **kwargs)
        reset, step = env.reset, env.step

        def reset_watched(**options):
            obs, info = reset(**options)
            given.append([obs])
            return obs, info

        def step_watched(action):
            result = step(action)
            given[-1].append((np.array(action), result[0], result[4]))
            if len(given) == 3 and len(given[-1]) == 4:  # Ctrl-C in the third episode, after its third step
                stop.set()
            return result

        env.reset, env.step = reset_watched, step_watched
        return env

    monkeypatch.setattr(deploy, "make_robot_env", watched)
    monkeypatch.setattr(deploy, "load_policy", warmed)
    twin = SimTwin(
        SimTwinConfig(rate_hz=RATE, domain_id=DOMAIN, report_interval=0, cameras=["front"], camera_rate_hz=25)
    )
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    shield = {"hold_after": 5 / RATE}  # in this process beside the twin: five periods (tests/test_robot_env.py)
    hardware = RobotEnvConfig(
        domain_id=DOMAIN, control_rate_hz=RATE, cameras=["front"], max_image_age=0.5, shield=shield
    )
    bag = tmp_path / "session"
    began = time.monotonic()
    try:
        cfg = DeployConfig(run=str(run_dir), hardware=hardware, episodes=3, episode_steps=6, record=str(bag))
        cfg.record_compressed = True
        summary = deploy.run(cfg, stop)
    finally:
        twin.stop()
        thread.join(timeout=5)
        twin.close()
    deployed_s = time.monotonic() - began
    assert summary["episodes"] == 3 and summary["steps"] == 15 and summary["policy_errors"] == 0
    record = summary["record"]
    assert record["dropped_steps"] == 0 and record["write_errors"] == 0 and record["writer_ms"]["steps"] == 18
    print(
        json.dumps(
            {"deployed_s": round(deployed_s, 1), **{k: record[k] for k in ("loop_ms", "loop_cpu_ms", "writer_ms")}}
        )
    )

    counts: dict[str, int] = {}
    with AnyReader([bag], default_typestore=HUMBLE) as reader:  # every message, each deserialized
        for connection, _, raw in reader.messages():
            reader.deserialize(raw, connection.msgtype)
            counts[connection.topic] = counts.get(connection.topic, 0) + 1
    assert counts == {topic: n for topic, n in record["messages"].items() if n}
    assert counts[ACTION_TOPIC] == 15 and counts[observation_topic("pixels_front")] == 18
    assert counts["/joint_states"] > 100  # the bridge's topics as before

    # a step whose observation was stale or whose action came late (a busy machine) ends its episode there
    lengths = [
        next((t + 1 for t, (_, _, i) in enumerate(s[1:]) if i["stale_observation"] or i.get("late_action")), 6)
        for s in given[:2]
    ]
    print(json.dumps({"episode_lengths": lengths}))
    out = convert(bag, tmp_path / "data")
    assert [(w["episode"], w["steps"]) for w in out["written"]] == [(0, lengths[0]), (1, lengths[1])]
    assert out["dropped"] == [{"episode": 2, "why": "the bag ends before it ended (3 steps recorded)"}]
    dataset = EpisodeDataset.open(tmp_path / "data")
    spec = deploy.load_policy(run_dir)[1]
    assert dataset.obs_spec == dataset_obs_spec(spec) and dataset.metadata == {"task": "panda_reach", "reward": "dense"}
    assert dataset.obs_spec["pixels_front"].shape == (3, 64, 64)
    for episode, seen, length in zip(dataset, given[:2], lengths, strict=True):
        assert len(seen) == 7 and len(episode) == length
        observations = [seen[0]] + [obs for _, obs, _ in seen[1 : length + 1]]
        for key in spec.observations:
            recorded = episode.obs[key].numpy()
            expected = np.stack([o[key][-3:] if key == "pixels_front" else o[key] for o in observations])
            assert np.array_equal(recorded, expected), key
        actions = np.stack([a for a, _, _ in seen[1 : length + 1]]).astype(np.float32)
        np.testing.assert_array_equal(episode.action.numpy(), actions)
        assert episode.truncated.tolist() == [False] * (length - 1) + [True] and not episode.terminated.any()
        distance = np.linalg.norm(episode.obs["ee_pos"][1:] - episode.obs["target"][1:], axis=-1)
        np.testing.assert_allclose(episode.reward.numpy(), -distance, rtol=1e-5)
        # the stacks the policy acted on, rebuilt from the dataset's frames as a run's env stacks them
        stack = fresh_stack(episode.obs["pixels_front"][0], spec.frame_stack)
        for t, obs in enumerate(observations):
            stack = stack if t == 0 else push_frame(stack, episode.obs["pixels_front"][t])
            assert np.array_equal(stack.numpy(), obs["pixels_front"]), t
        assert episode.metadata["checkpoint"] == "step_000000100"
    # the goals reach draws at each reset are in the data, one per episode
    targets = [e.obs["target"] for e in dataset]
    assert all((t == t[0]).all() for t in targets) and not torch.equal(targets[0][0], targets[1][0])
