"""robotrl-record on a robot (hardware=sim_twin): demonstrations recorded through the robot env and the shield on the
simulated twin (real MuJoCo in a thread, real DDS on loopback), into the dataset format simulation writes. Pick,
which a robot cannot score (its reward needs the fingers' contacts), is scored by the operator's success mark: the
scripted expert's, judged from the tracked cube, or a pad's Start button over ROS. Domain ids 224-228."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import TwinThread

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.robot_vec_env import ActorRobotConfig
from robotrl.hardware.ros2.bridge import make_bridge
from robotrl.hardware.ros2.msgs import Joy
from robotrl.hardware.sim_twin import ASSETS
from robotrl.tasks.configs import ArmTaskConfig
from robotrl.tasks.panda_pick_cube import CUBE_HALF, LIFT_HEIGHT

from robotrl.data.dataset import INDEX_FILE, EpisodeDataset
from robotrl.hil.reward_classifier import frames_from_episodes
from robotrl.record import RecordConfig, record

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

RATE = 250.0


def hardware(domain_id: int, objects: tuple[str, ...] = ()) -> RobotEnvConfig:
    cfg = RobotEnvConfig(domain_id=domain_id, control_rate_hz=RATE, connect_timeout=3.0, reset_timeout=15.0)
    cfg.shield = {"workspace_min": [0.1, -0.6, 0.0], "workspace_max": [0.8, 0.6, 0.9]}  # the fingers reach the table
    cfg.objects, cfg.scene_timeout, cfg.scene_settle = list(objects), 5.0, 0.2
    return cfg


def test_the_scripted_expert_records_picks_on_the_twin_marked_successful_where_it_saw_the_lift(tmp_path):
    """teleop=scripted on a robot: pick's expert, fed the robot env's observation (the tracked cube), grasps and
    lifts the twin's cube, the twin's front camera recorded as the policy would see it; pick cannot score itself on
    a robot, so the expert marks success where it sees the cube lifted in hand, and that last frame is the reward
    classifier's positive. A second session resumes the dataset."""
    pick = ArmTaskConfig(name="panda_pick_cube", obs="state+pixels", cameras=["front"])
    twin_cfg = {"model": str(ASSETS / "panda_pick_cube.xml"), "objects": ["cube"], "cameras": ["front"]}
    with TwinThread(224, **twin_cfg) as twin:
        robot = hardware(224, ("cube",))
        robot.cameras = ["front"]
        cfg = RecordConfig(task=pick, teleop="scripted", episodes=1, hardware=robot)
        first = record(cfg, tmp_path / "picks")
        body = twin._object_bodies["cube"]
        assert float(twin.data.xpos[body][2]) - CUBE_HALF >= LIFT_HEIGHT - 0.01  # held up when the episode ended
        second = record(cfg, tmp_path / "picks")  # resumed into the same dataset
    assert first["stopped"] == "done" and first["dropped_stale"] == 0 and second["episodes"] == 2
    dataset = EpisodeDataset.open(tmp_path / "picks")
    assert dataset.metadata["reward"] == "operator"  # not the simulated task's dense reward
    for episode in dataset.load_all():
        assert episode.metadata["robot"] == "panda" and episode.metadata["device"] == "scripted"
        assert bool(episode.success[-1]) and not episode.success[:-1].any()  # marked once, where it ended
        assert episode.obs["cube_pos"][-1, 2] - CUBE_HALF >= LIFT_HEIGHT  # the tracked cube, lifted
        assert episode.obs["cube_pos"][0, 2] < CUBE_HALF + 0.01  # from the table: the scene was put back
        assert (episode.reward == 0).all() and bool(episode.intervention.all())
        assert 20 < len(episode) < 100  # the expert's pick on the twin takes 60-90 steps of the 100
        assert episode.obs["pixels_front"].shape[1:] == (3, 84, 84) and episode.obs["pixels_front"].float().std() > 5
    frames, labels = frames_from_episodes(dataset.load_all(), ["front"])  # as robotrl-train-classifier reads them
    assert frames["pixels_front"].shape[0] == len(labels) and int(labels.sum()) == 2


def test_a_pads_start_button_marks_success_and_ends_the_episode_over_ros(tmp_path):
    """teleop=joy on a robot: a person's pad through joy_node (a thread publishing as it does) moves the arm
    (left stick up: +x) and presses Start after a second; that step is marked successful and ends the episode."""
    pick = ArmTaskConfig(name="panda_pick_cube", episode_steps=100)
    rest = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    pushed = list(rest)
    pushed[1] = 0.6
    stop = threading.Event()
    with TwinThread(225, model=str(ASSETS / "panda_pick_cube.xml"), objects=["cube"]):
        with make_bridge("dds", domain_id=226) as person:
            publisher = person.publisher("/joy", Joy, "sensor_data")

            def joy_node() -> None:  # 20 Hz while held; Start pressed from 2 s on (the robot env homes first)
                started = time.monotonic()
                while not stop.is_set():
                    buttons = [0] * 11
                    buttons[7] = int(time.monotonic() - started > 2.0)
                    publisher.publish(Joy(axes=[float(a) for a in pushed], buttons=buttons))
                    time.sleep(0.05)

            thread = threading.Thread(target=joy_node, daemon=True)
            thread.start()
            try:
                cfg = RecordConfig(
                    task=pick, teleop="joy", teleop_domain_id=226, episodes=1, hardware=hardware(225, ("cube",))
                )
                summary = record(cfg, tmp_path / "marked")
            finally:
                stop.set()
                thread.join(timeout=5)
    assert summary["stopped"] == "done"
    (episode,) = EpisodeDataset.open(tmp_path / "marked").load_all()
    assert episode.metadata["device"] == "joy" and len(episode) < 100
    assert bool(episode.success[-1]) and not episode.success[:-1].any()
    assert episode.obs["ee_pos"][-1, 0] > episode.obs["ee_pos"][0, 0] + 0.01  # the stick moved it along +x


def test_a_robot_lost_mid_session_keeps_the_whole_episodes_and_drops_the_one_in_progress(tmp_path):
    """The twin stops publishing after the first episode is saved: the episode in progress is cut short by a stale
    observation and dropped, the next reset finds no fresh joint state, and the session ends saying the robot is
    lost, the dataset holding whole episodes only."""
    reach = ArmTaskConfig(name="panda_reach", episode_steps=15)
    out = tmp_path / "reach"
    with TwinThread(227) as twin:
        cfg = RecordConfig(task=reach, teleop="scripted", episodes=10, noise=0.3, hardware=hardware(227))
        result: dict = {}
        session = threading.Thread(target=lambda: result.update(record(cfg, out)), daemon=True)
        session.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ((out / INDEX_FILE).exists() and len(EpisodeDataset.open(out))):
            time.sleep(0.05)
        time.sleep(0.2)  # into the next episode
        twin.stop()
        session.join(timeout=30)
    assert not session.is_alive()
    assert result["stopped"].startswith("the robot is lost") and result["episodes"] >= 1
    dataset = EpisodeDataset.open(out)
    assert dataset.metadata["reward"] == reach.reward  # reach scores itself on a robot
    for episode in dataset.load_all():
        assert len(episode) == 15 or bool(episode.success[-1])  # whole: to its time limit or its success


def test_bad_robot_recording_settings_are_refused_by_name():
    pick = ArmTaskConfig(name="panda_pick_cube")
    with pytest.raises(ValueError, match=r"rate_hz=10\.0: on a robot the robot env paces"):
        RecordConfig(task=pick, teleop="scripted", rate_hz=10.0, hardware=RobotEnvConfig()).validate()
    with pytest.raises(ValueError, match=r"robot\.reward=classifier: recording collects"):
        robot = ActorRobotConfig(reward="classifier")
        RecordConfig(task=pick, teleop="scripted", hardware=RobotEnvConfig(), robot=robot).validate()
