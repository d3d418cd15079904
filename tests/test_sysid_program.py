"""`robotrl-sysid` (hardware/identify.py): a twin with a known stiffness and command latency is excited through the
shield over DDS on loopback, recorded to a bag, fitted, and the overlay written; the bag refits without a robot; a
bag without the topics a fit needs, and bad settings, are refused by name."""

import json
import threading

import numpy as np
import pytest
import yaml
from robotrl.hardware.identify import SysidConfig, run
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.sim_twin import SimTwin, SimTwinConfig

from robotrl.core.model_overlay import ModelOverlay, load_overlay

RATE = 250.0  # the twin's and the shield's rate: 2 physics steps a period, light enough for a loaded test machine
TRUTH_KP, TRUTH_LATENCY = 1600.0, 0.012


@pytest.fixture
def priors(tmp_path):
    """Two unknowns, so the fit takes seconds: joint2's stiffness and the command latency."""
    path = tmp_path / "priors.yaml"
    path.write_text(
        yaml.safe_dump({"robot": "panda", "command_latency": [0.0, 0.05], "actuators": {"act2": {"kp": [500, 5000]}}})
    )
    return str(path)


@pytest.mark.dds
def test_a_known_stiffness_and_latency_are_found_on_the_twin_and_refit_from_the_bag(tmp_path, priors):
    truth = tmp_path / "truth.yaml"
    ModelOverlay("panda", {"act2.kp": TRUTH_KP, "command_latency": TRUTH_LATENCY}).save(truth)
    twin = SimTwin(SimTwinConfig(rate_hz=RATE, domain_id=231, report_interval=0, overlay=str(truth)))
    assert twin.latency_steps == 6  # the overlay's latency, in the twin's physics steps
    thread = threading.Thread(target=twin.run, daemon=True)
    thread.start()
    try:
        hardware = RobotEnvConfig(domain_id=231, control_rate_hz=RATE, require_estop_publisher=True)
        summary = run(SysidConfig(hardware=hardware, out=str(tmp_path / "s"), duration=4.0, priors=priors))
    finally:
        twin.stop()
        thread.join(timeout=10)
        twin.close()
    messages = summary["excitation"]["messages"]
    # 5 s at RATE (rest, 4 s of excitation, rest); a loaded machine's threads miss some periods
    assert messages["/joint_states"] > 2.5 * RATE and messages["/forward_position_controller/commands"] > 2.5 * RATE
    overlay = load_overlay(tmp_path / "s" / "overlay.yaml")
    assert json.loads((tmp_path / "s" / "sysid.json").read_text())["values"] == summary["values"]
    # the twin's 12 ms: 11.1 and 12.4 ms on a quiet 2-core machine, 15.1 ms with four busy processes beside it (the
    # in-process twin's thread waits for the interpreter; 2026-11-28)
    assert 0.008 <= summary["values"]["command_latency"] <= 0.020, summary["values"]
    assert summary["values"]["act2.kp"] == pytest.approx(TRUTH_KP, rel=0.1), summary
    assert overlay.parameters.keys() <= {"act2.kp", "command_latency"}
    assert summary["heldout_error_ratio"] > 1.5, summary  # the fitted model tracks the held-out motion better

    refit = run(SysidConfig(bag=str(tmp_path / "s" / "excitation"), out=str(tmp_path / "r"), priors=priors))
    assert "excitation" not in refit
    assert refit["values"] == pytest.approx(summary["values"], rel=1e-6)


def test_a_bag_without_the_commands_is_refused_naming_the_topic(tmp_path):
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    kind = "sensor_msgs/msg/JointState"
    joint_state, header, stamp = (store.types[t] for t in (kind, "std_msgs/msg/Header", "builtin_interfaces/msg/Time"))
    bag = tmp_path / "bag"
    with Writer(bag, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        connection = writer.add_connection("/joint_states", kind, typestore=store)
        for i in range(3):
            zeros = np.zeros(7)
            msg = joint_state(header(stamp(i, 0), ""), [f"joint{j}" for j in range(1, 8)], zeros, zeros, zeros)
            writer.write(connection, i * 10**9, store.serialize_cdr(msg, kind))
    missing = r"has no topic /forward_position_controller/commands; it has \['/joint_states'\]"
    with pytest.raises(ValueError, match=missing):
        run(SysidConfig(bag=str(bag), out=str(tmp_path / "out")))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"duration": 1.0}, "duration must be at least 2 s"),
        ({"amplitude": 0.8}, r"amplitude must be in \(0, 0.5\] rad"),
        ({"holdout": 0.9}, r"holdout must be a share in \[0, 0.5\]"),
        ({"bag": "/nonexistent/bag"}, "bag='/nonexistent/bag' does not exist"),
        ({"priors": "kuka"}, "sysid priors 'kuka': no file"),
    ],
)
def test_bad_settings_are_refused_before_anything_moves(tmp_path, settings, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        run(SysidConfig(out=str(tmp_path / "out"), **settings))
    assert not (tmp_path / "out" / "excitation").exists()
