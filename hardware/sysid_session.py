"""A system-identification session on a robot (or the twin): a multi-sine excitation run through the shield and
recorded to an MCAP bag, and such a bag (or one `robotrl-deploy record=` wrote) read back as a
`robotrl.sim2real.sysid.Recording` on the model's physics-step grid.

The bag holds the joint states as the robot published them and the commands as the shield sent them; the fit
takes the commands as sent, so whatever the shield changed (a rate limit, a workspace stop) is part of the record,
not an error in it. Times: a joint state is placed at its header stamp (the robot's measurement time), a command at
the time it was sent (robotrl-sysid's own recording logs each command at its send time; a deploy bag at its
receipt, the loopback later); both are wall-clock
nanoseconds, so the command latency fitted is everything between a command leaving the host and the servo acting
on it. That needs the robot's clock and this machine's to agree (chrony or PTP, as a ROS 2 lab runs them): a bag
whose joint states were received, on median, more than MAX_CLOCK_OFFSET_S away from their stamps is refused.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from robotrl.hardware.robot_env import RobotEnv
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.sim2real.sysid import Recording, multisine

log = logging.getLogger(__name__)

REST_S = 0.5  # recorded at rest before the excitation and after it: the fit starts from a measured rest
# joint states received further than this from their header stamps (median) mean the robot's clock is not this
# machine's: their difference would be fitted as command latency
MAX_CLOCK_OFFSET_S = 0.02


def robot_actuators(model: mujoco.MjModel, joints: list[str]) -> list[str]:
    """The position actuator that drives each joint (by the model's transmission), or KeyError naming the joint."""
    names = []
    for joint in joints:
        joint_id = model.joint(joint).id
        match = [
            a
            for a in range(model.nu)
            if model.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT and model.actuator_trnid[a, 0] == joint_id
        ]
        if not match:
            raise KeyError(f"joint {joint!r} has no actuator in the model")
        names.append(model.actuator(match[0]).name)
    return names


def record_excitation(
    hw: RobotEnvConfig, model: mujoco.MjModel, bag: Path, duration: float, amplitude: float, seed: int
) -> dict[str, Any]:
    """Move the robot home through the shield, then run a multi-sine excitation of every arm joint around home
    (`sim2real.sysid.multisine`) for `duration` s at the shield's control rate, recording joint states and the
    commands sent into `bag`; back home after. Every control period the e-stop publisher is checked (gone: the
    shield latches) and a latched shield ends the session. Returns what happened: messages recorded, shield
    corrections, periods the control thread missed."""
    # lazy: the ros extra (Cyclone DDS messages, rosbags' writer)
    from robotrl.hardware.deploy import BagRecorder
    from robotrl.hardware.ros2.msgs import Float64MultiArray, JointState

    env = RobotEnv(hw, control="joint_position", observe=["arm_qpos"])
    try:
        joints = list(env.spec.joints)
        actuators = robot_actuators(model, joints)
        home = env.spec.home.double().numpy()
        times, commands, _ = multisine(model, joints, actuators, duration, seed, amplitude, centre=home)
        targets = commands[:, [model.actuator(name).id for name in actuators]]
        env.reset()
        commands_topic = env.topics["commands"]
        recorder = BagRecorder(env.bridge, bag, {hw.joint_states_topic: (JointState, hw.state_qos)})
        # commands at the time the control thread sent them: a subscription's receipt time comes later by however
        # long its thread waited, and that wait would be fitted as less command latency than the robot has
        env.link.on_command = recorder.sent_writer(commands_topic, Float64MultiArray)
        try:
            period, dt = 1.0 / hw.control_rate_hz, float(times[1] - times[0])
            _follow(env, lambda elapsed: home, REST_S, period)
            _follow(env, lambda elapsed: targets[min(int(elapsed / dt), len(times) - 1)], float(times[-1]), period)
            _follow(env, lambda elapsed: home, REST_S, period)
        finally:
            env.link.on_command = None
            recorder.close()
    finally:
        env.close()  # before reading its counters: the control thread has stopped
    return {
        "bag": str(bag),
        "messages": dict(recorder.counts),
        "shield": {key: int(value) for key, value in env.totals.items()},
        "missed_periods": int(env.stats["missed_periods"]),
        "commands_topic": commands_topic,
    }


def _follow(env: RobotEnv, target, seconds: float, period: float) -> None:
    """Post `target(elapsed)` every control period for `seconds`: a live command, so the shield never times it out.
    Each period the e-stop publisher is checked (gone: the shield latches, as a robot env's step does); a latched
    shield ends the session."""
    start, tick = time.monotonic(), 0
    while (elapsed := time.monotonic() - start) <= seconds:
        env.link.check_estop_publisher()
        if env.link.latched is not None:
            raise RuntimeError(f"the shield latched during the excitation ({env.link.latched}); the arm holds")
        env.link.post(target(elapsed))
        tick += 1
        time.sleep(max(0.0, start + tick * period - time.monotonic()))


def read_recording(
    bag: str | Path, model: mujoco.MjModel, joints: list[str], joint_states_topic: str, commands_topic: str
) -> Recording:
    """The joint positions and commands in `bag` resampled on `model`'s physics step: commands held from the time
    each was sent, positions interpolated between measurements. Names a missing topic, a joint the states lack, a
    command of the wrong length; actuators the commands do not drive (a gripper) hold their position at the start."""
    # lazy: the ros extra (rosbags' reader)
    from rosbags.highlevel import AnyReader

    bag = Path(bag)
    if not bag.exists():
        raise FileNotFoundError(f"bag {str(bag)!r} does not exist")
    actuators = robot_actuators(model, joints)
    state_times, received, positions, command_times, commands = [], [], [], [], []
    gripper_positions: dict[str, float] = {}
    with AnyReader([bag]) as reader:
        present = {c.topic: c.msgtype for c in reader.connections}
        for topic in (joint_states_topic, commands_topic):
            if topic not in present:
                raise ValueError(f"bag {bag} has no topic {topic}; it has {sorted(present)}")
        wanted = [c for c in reader.connections if c.topic in (joint_states_topic, commands_topic)]
        for connection, stamp_ns, raw in reader.messages(connections=wanted):
            msg = reader.deserialize(raw, connection.msgtype)
            if connection.topic == commands_topic:
                values = np.asarray(msg.data, dtype=np.float64)
                if values.shape != (len(joints),):
                    raise ValueError(f"{commands_topic}: a command has {values.size} values, the arm {len(joints)}")
                command_times.append(stamp_ns * 1e-9)
                commands.append(values)
                continue
            index = {name: i for i, name in enumerate(msg.name)}
            missing = [joint for joint in joints if joint not in index]
            if missing:
                raise ValueError(f"{joint_states_topic}: the joint states lack {missing}")
            header = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
            state_times.append(header if header > 0 else stamp_ns * 1e-9)
            received.append(stamp_ns * 1e-9)
            positions.append([msg.position[index[joint]] for joint in joints])
            if not gripper_positions:
                gripper_positions = {name: float(msg.position[i]) for name, i in index.items() if name not in joints}
    if len(commands) < 2 or len(state_times) < 2:
        raise ValueError(f"bag {bag}: {len(commands)} commands and {len(state_times)} joint states; a fit needs both")
    state_times, positions = np.asarray(state_times), np.asarray(positions)
    offset = float(np.median(np.asarray(received) - state_times))
    if abs(offset) > MAX_CLOCK_OFFSET_S:
        raise ValueError(
            f"bag {bag}: joint states were received {offset * 1e3:.1f} ms (median) from their header stamps: the "
            "robot's clock and the recording machine's differ, and the difference would be fitted as latency; "
            "synchronise them (chrony, PTP) and record again"
        )
    order = np.argsort(state_times, kind="stable")
    state_times, positions = state_times[order], positions[order]
    command_times, commands = np.asarray(command_times), np.asarray(commands)
    dt = float(model.opt.timestep)
    start, end = max(command_times[0], state_times[0]), state_times[-1]  # the last command holds to the end
    if end - start < 1.0:
        raise ValueError(
            f"bag {bag}: its commands ({command_times[0]:.3f}..{command_times[-1]:.3f} s) and joint states "
            f"({state_times[0]:.3f}..{state_times[-1]:.3f} s) overlap for less than a second"
        )
    grid = start + np.arange(int((end - start) / dt) + 1) * dt
    held = np.clip(np.searchsorted(command_times, grid, side="right") - 1, 0, len(commands) - 1)
    qpos = np.stack([np.interp(grid, state_times, positions[:, j]) for j in range(len(joints))], axis=1)
    initial = model.qpos0.copy()
    for j, joint in enumerate(joints):
        initial[model.jnt_qposadr[model.joint(joint).id]] = qpos[0, j]
    full = np.zeros((len(grid), model.nu))
    for name, value in gripper_positions.items():  # the actuators the commands leave alone hold where they were
        joint_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if joint_id >= 0:
            initial[model.jnt_qposadr[joint_id]] = value
            for a in range(model.nu):
                if model.actuator_trnid[a, 0] == joint_id and model.actuator(a).name not in actuators:
                    full[:, a] = value
    full[:, [model.actuator(name).id for name in actuators]] = commands[held]
    return Recording(grid - start, full, qpos, tuple(joints), initial)
