"""Observation assembly for the robot env without a bridge, a DDS domain or a twin: plain messages, wrapped as
the bridge hands them over (`Received`: the message and its receipt time), become observation entries with
their ages; old, refused or missing inputs make the observation stale and say why; an action from an
observation whose inputs aged past their limit is late; a tracked pose that jumps faster than
max_object_speed is not acted on; camera frames are stacked as the runtime's FrameStack stacks them."""

import math
import time
from collections import Counter

import numpy as np
import pytest
import torch

pytest.importorskip("cyclonedds", reason='the message types need the ros extra: pip install "robotrl[ros]"')

from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.robot_kinematics import ASSETS, Kinematics
from robotrl.hardware.robot_observation import (
    JointReading,
    ObservationAssembler,
    StaleObservationError,
    read_joint_state,
)
from robotrl.hardware.ros2 import Received
from robotrl.hardware.ros2.tensors import image_msg, joint_state_msg, pose_msg, time_msg
from robotrl.hardware.state_clock import StampClock

from robotrl.core.robot_spec import load_robot_spec
from robotrl.runtime.frame_stack import fresh_stack, push_frame

SPEC = load_robot_spec("panda")
KINEMATICS = Kinematics(ASSETS / "panda.xml", SPEC)
HOME = SPEC.home.double()
PERIOD = 1 / 25


def assembler(cfg: RobotEnvConfig | None = None, **kwargs) -> ObservationAssembler:
    goal = {k: np.asarray(v, np.float32) for k, v in kwargs.pop("goal", {}).items()}
    args = {"relative_goal": {}, "held": {}, "held_relative": {}, **kwargs}
    return ObservationAssembler(cfg or RobotEnvConfig(), SPEC, KINEMATICS, Counter(), goal, **args)


def state(age: float = 0.0, position=HOME, velocity=None) -> JointReading:
    return JointReading(torch.as_tensor(position, dtype=torch.float64), velocity, None, time.monotonic() - age)


def pose(position, quat_wxyz=(1.0, 0.0, 0.0, 0.0), age: float = 0.0, frame: str = "", stamped_ago: float = 0.0):
    msg = pose_msg(position, quat_wxyz, time_msg(time.time() - stamped_ago), frame_id=frame)
    return Received(msg, time.monotonic() - age, None)


def test_a_joint_state_becomes_the_arm_entries_goals_and_held_points():
    names = [*SPEC.joints, *SPEC.gripper.joints]
    msg = joint_state_msg(names[::-1], [*[0.02, 0.03], *HOME.flip(0).tolist()], velocity=[0.5] * 9)
    reading = read_joint_state(msg, time.monotonic(), SPEC, StampClock())
    torch.testing.assert_close(reading.position, HOME)  # matched by name, not by order
    assert reading.gripper == 0.03 and reading.velocity.tolist() == [0.5] * 7
    with pytest.raises(KeyError):
        read_joint_state(joint_state_msg(["a"], [0.0]), time.monotonic(), SPEC, StampClock())

    obs_maker = assembler(
        goal={"hole": [0.5, 0.0, 0.1], "target": [0.4, 0.1, 0.3]},
        relative_goal={"to_target": "target"},
        held={"peg_tip": np.array([0.0, 0.0, 0.06])},
        held_relative={"tip_to_hole": ("hole", "peg_tip")},
    )
    now = time.monotonic()
    reading.stamp = now - 0.01
    obs, info = obs_maker.assemble(reading, None, now, {}, {})
    assert info == {"observation_age": pytest.approx(0.01), "stale_observation": 0}
    assert obs_maker.ages == [pytest.approx(0.01)] and obs_maker.fresh and obs_maker.state is reading
    ee, _, _ = KINEMATICS.pose(HOME.numpy())
    np.testing.assert_allclose(obs["ee_pos"], ee, atol=1e-6)
    np.testing.assert_allclose(obs["to_target"], obs["target"] - obs["ee_pos"], atol=1e-6)
    tool_axis = obs["peg_tip"] - obs["ee_pos"]  # 6 cm along the tool's z: downwards at the Panda's home pose
    assert np.linalg.norm(tool_axis) == pytest.approx(0.06, abs=1e-6) and tool_axis[2] < -0.059
    np.testing.assert_allclose(obs["tip_to_hole"], obs["hole"] - obs["peg_tip"], atol=1e-6)
    assert obs in obs_maker.observation_space


def test_an_old_refused_missing_or_non_finite_joint_state_is_stale_and_says_why():
    obs_maker = assembler()
    _, info = obs_maker.assemble(state(age=0.08), None, time.monotonic(), {}, {})
    assert info["stale_observation"] == 1 and info["stale_reason"].startswith("joint_states 8") and not obs_maker.fresh
    _, info = obs_maker.assemble(state(), "state_glitch", time.monotonic(), {}, {})
    assert info["stale_reason"] == "joint_states refused by the shield (state_glitch)"
    _, info = obs_maker.assemble(state(velocity=torch.full((7,), math.nan)), None, time.monotonic(), {}, {})
    assert info["stale_reason"] == "non-finite state"
    assert obs_maker.stats["stale_observations"] == 3
    with pytest.raises(StaleObservationError, match="no joint state has arrived on /joint_states"):
        obs_maker.assemble(None, None, time.monotonic(), {}, {})
    strict = assembler(RobotEnvConfig(on_stale="raise"))
    with pytest.raises(StaleObservationError, match="observation not fresh: joint_states refused"):
        strict.assemble(state(), "state_out_of_order", time.monotonic(), {}, {})


def test_a_tracked_pose_gives_the_object_entries_and_a_bad_one_keeps_the_last_good_pose():
    cfg = RobotEnvConfig(objects=["cube"], object_frame="base", max_object_age=0.1, max_object_stamp_age=1.0)
    obs_maker = assembler(cfg, goal={"goal": [0.6, 0.1]})
    assert obs_maker.tracked_objects == ["cube"]
    assert sorted(obs_maker.object_entries) == ["cube_pos", "cube_quat", "cube_to_goal", "to_cube"]
    obs, info = obs_maker.assemble(state(), None, time.monotonic(), {}, {})
    assert info["stale_reason"] == "object cube has sent no pose"
    # a tracker's quaternion with w < 0: the same rotation, observed w-first with w >= 0
    good = pose([0.5, 0.1, 0.03], [-0.9659258, 0.0, 0.0, -0.2588190], frame="base")
    obs, info = obs_maker.assemble(state(), None, time.monotonic(), {"cube": good}, {})
    assert info["stale_observation"] == 0
    np.testing.assert_allclose(obs["cube_pos"], [0.5, 0.1, 0.03], atol=1e-6)
    np.testing.assert_allclose(obs["cube_quat"], [0.9659258, 0.0, 0.0, 0.2588190], atol=1e-6)
    np.testing.assert_allclose(obs["to_cube"], obs["cube_pos"] - obs["ee_pos"], atol=1e-6)
    np.testing.assert_allclose(obs["cube_to_goal"], [0.1, 0.0], atol=1e-6)
    assert [what for what, *_ in obs_maker.inputs] == ["object cube pose"]
    bad = [
        (pose([0.7, 0.1, 0.03], frame="base", age=0.5), "object cube pose 5"),  # 500 ms and what the test took
        (pose([0.7, 0.1, 0.03], frame="world"), "not hardware.object_frame 'base'"),
        (pose([0.7, 0.1, 0.03], frame="base", stamped_ago=3.0), "pose stamped 3"),
        (pose([math.nan, 0.1, 0.03], frame="base"), "non-finite"),
        (pose([0.7, 0.1, 0.03], [0.0, 0.0, 0.0, 0.0], frame="base"), "not a unit quaternion"),
    ]
    for received, expected in bad:
        obs, info = obs_maker.assemble(state(), None, time.monotonic(), {"cube": received}, {})
        assert info["stale_observation"] == 1 and expected in info["stale_reason"], info
        np.testing.assert_allclose(obs["cube_pos"], [0.5, 0.1, 0.03], atol=1e-6)  # the last good pose, held
        assert obs_maker.inputs == []
    assert obs_maker.stats["bad_object_pose"] == 3  # another frame, NaN, not a quaternion


def test_a_pose_jumping_faster_than_max_object_speed_is_not_acted_on_until_it_could_be_real():
    obs_maker = assembler(RobotEnvConfig(objects=["puck"], max_object_speed=3.0, max_object_age=10.0))
    t0 = time.monotonic() - 5.0
    first = Received(pose_msg([0.5, 0.1, 0.03], [1, 0, 0, 0]), t0, None)
    _, info = obs_maker.assemble(state(), None, time.monotonic(), {"puck": first}, {})
    assert info["stale_observation"] == 0
    swapped = Received(pose_msg([0.5, 1.5, 0.03], [1, 0, 0, 0]), t0 + 0.01, None)  # 1.4 m in 10 ms
    obs, info = obs_maker.assemble(state(), None, time.monotonic(), {"puck": swapped}, {})
    assert (
        "object puck pose jumped 1400 mm in 10 ms (faster than hardware.max_object_speed 3.0 m/s)"
        in (info["stale_reason"])
    )
    np.testing.assert_allclose(obs["puck_pos"], [0.5, 0.1, 0.03], atol=1e-6)
    assert obs_maker.stats["object_jumps"] == 1
    stayed = Received(swapped.msg, t0 + 0.6, None)  # 1.4 m in 0.6 s: could be real
    _, info = obs_maker.assemble(state(), None, time.monotonic(), {"puck": stayed}, {})
    assert info["stale_observation"] == 0
    # a person moves things between episodes: no jump is judged across a reset
    obs_maker.objects.forget_motion()
    back = Received(pose_msg([0.5, 0.1, 0.03], [1, 0, 0, 0]), t0 + 0.61, None)
    _, info = obs_maker.assemble(state(), None, time.monotonic(), {"puck": back}, {})
    assert info["stale_observation"] == 0


def test_an_action_is_late_once_any_input_of_its_observation_aged_past_its_limit_and_a_period():
    cfg = RobotEnvConfig(objects=["cube"], max_state_age=0.05, max_object_age=0.1)
    obs_maker = assembler(cfg)
    now = time.monotonic()
    obs_maker.assemble(state(), None, now, {"cube": pose([0.5, 0.1, 0.03])}, {})
    assert obs_maker.late_reason(now, PERIOD) is None
    reason = obs_maker.late_reason(now + 0.05 + PERIOD + 0.01, PERIOD)
    assert reason.startswith("joint state is ") and reason.endswith("(hardware.max_state_age 50 ms + a period)")
    obs_maker.state = state(age=-1.0)  # a joint state that stays young: the pose is what is late
    reason = obs_maker.late_reason(now + 0.1 + PERIOD + 0.01, PERIOD)
    assert reason.startswith("object cube pose is ") and reason.endswith("(hardware.max_object_age 100 ms + a period)")


def test_camera_frames_become_pixel_entries_stacked_as_the_runtime_stacks_them():
    cfg = RobotEnvConfig(cameras=["front"], image_size=4, max_image_age=0.2)
    obs_maker = assembler(cfg, frame_stack=3)
    assert obs_maker.observation_space["pixels_front"].shape == (9, 4, 4)
    obs, info = obs_maker.assemble(state(), None, time.monotonic(), {}, {})
    assert info["stale_reason"] == "camera front has sent nothing" and obs["pixels_front"].shape == (3, 4, 4)
    old = Received(image_msg(torch.zeros(3, 8, 8, dtype=torch.uint8)), time.monotonic() - 1.0, None)
    _, info = obs_maker.assemble(state(), None, time.monotonic(), {}, {"front": old})
    assert info["stale_reason"] == "camera front frame too old"

    frames = [torch.full((3, 8, 8), 10 * k, dtype=torch.uint8) for k in range(1, 5)]
    bgr = image_msg(frames[0].flip(0).contiguous(), "bgr8")  # the same picture from a bgr camera
    np.testing.assert_array_equal(obs_maker.image(bgr), obs_maker.image(image_msg(frames[0])))
    stacks = []
    for k, frame in enumerate(frames):
        received = Received(image_msg(frame), time.monotonic(), None)
        obs, info = obs_maker.assemble(state(), None, time.monotonic(), {}, {"front": received})
        assert info["stale_observation"] == 0 and obs["pixels_front"].shape == (3, 4, 4)
        assert obs_maker.inputs[0][0] == "camera front frame"
        stacks.append(obs_maker.stack(obs, fresh=k == 0)["pixels_front"])
    assert [stack[::3, 0, 0].tolist() for stack in stacks] == [[10] * 3, [10, 10, 20], [10, 20, 30], [20, 30, 40]]
    stacks[-1][:] = 0  # the observation is the caller's: changing it leaves the env's stack alone
    assert obs_maker._stacks["pixels_front"][::3, 0, 0].tolist() == [20, 30, 40]

    # the same stacking step as the runtime's FrameStack on a batch of envs
    batch = torch.stack([frame[:, :4, :4] for frame in frames[:2]])  # [E=2, 3, 4, 4]
    torch.testing.assert_close(fresh_stack(batch, 3), batch.repeat(1, 3, 1, 1))
    pushed = push_frame(fresh_stack(batch, 3), batch.flip(0))
    torch.testing.assert_close(pushed, torch.cat([batch, batch, batch.flip(0)], 1))
