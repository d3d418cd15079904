"""The ROS 2 bridge on real Cyclone DDS over loopback: in one process and across two, QoS behaviour, domain
isolation, input checks; the rclpy backend where rclpy is importable."""

from __future__ import annotations

import array
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from helpers import DEADLINE, wait_until
from robotrl.hardware.ros2 import (
    DEFAULT,
    LATCHED,
    SENSOR_DATA,
    Durability,
    QoSProfile,
    Reliability,
    make_bridge,
)
from robotrl.hardware.ros2.bridge import rclpy_available
from robotrl.hardware.ros2.dds_backend import LOOPBACK_CONFIG, dds_qos
from robotrl.hardware.ros2.msgs import MESSAGE_TYPES, Bool, Float64MultiArray, Image, JointState
from robotrl.hardware.ros2.names import dds_topic_name
from robotrl.hardware.ros2.rclpy_backend import LOOPBACK_ENV, discovery_environment, from_ros, to_ros

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]


def unique_topic(label: str) -> str:
    return f"/robotrl_test/{label}_{uuid.uuid4().hex[:10]}"


def collect(subscription, count: int, timeout: float = DEADLINE) -> list:
    received = []
    deadline = time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        subscription.wait(min(0.2, max(deadline - time.monotonic(), 0.0)))
        received += subscription.take()
    return received


@pytest.fixture
def bridge():
    with make_bridge("dds") as b:
        yield b


def test_pub_sub_in_one_process(bridge):
    topic = unique_topic("joint_states")
    seen = []
    subscription = bridge.subscription(topic, JointState, callback=seen.append)
    publisher = bridge.publisher(topic.lstrip("/"), JointState)  # a relative name is the same root topic
    assert wait_until(lambda: publisher.subscription_count() == 1 and subscription.publisher_count() == 1)
    assert subscription.latest() is None and subscription.take() == []

    sent = JointState(name=["j1", "j2"], position=[0.25, -1.5], velocity=[0.0, 1.0], effort=[])
    before = time.monotonic()
    publisher.publish(sent)
    (received,) = collect(subscription, 1)
    assert received.msg == sent
    assert before <= received.received_at <= time.monotonic() and received.age() >= 0.0
    assert abs(received.source_time - time.time()) < 5.0
    assert subscription.latest() is received and subscription.take() == []
    assert wait_until(lambda: seen == [sent])


def test_big_image_crosses_the_bridge(bridge):
    topic = unique_topic("image")
    subscription = bridge.subscription(topic, Image, SENSOR_DATA)
    publisher = bridge.publisher(topic, Image, SENSOR_DATA)
    assert wait_until(lambda: publisher.subscription_count() == 1)
    pixels = os.urandom(480 * 640 * 3)
    image = Image(height=480, width=640, encoding="rgb8", step=640 * 3, data=pixels)

    def arrived() -> bool:
        publisher.publish(image)  # best effort: send again until one arrives
        return subscription.wait(0.2)

    assert wait_until(arrived)
    assert subscription.latest().msg.data == pixels


PUBLISHER_PROCESS = """
import sys, time
from robotrl.hardware.ros2 import QoSProfile, make_bridge
from robotrl.hardware.ros2.msgs import Float64MultiArray

topic, count = sys.argv[1], int(sys.argv[2])
with make_bridge("dds") as bridge:
    publisher = bridge.publisher(topic, Float64MultiArray, QoSProfile(depth=count))
    deadline = time.monotonic() + 10
    while publisher.subscription_count() < 1:
        if time.monotonic() > deadline:
            sys.exit("no subscriber matched")
        time.sleep(0.01)
    for i in range(count):
        publisher.publish(Float64MultiArray(data=[float(i), i * 0.5]))
    if not publisher.wait_for_all_acked(10.0):
        sys.exit("not acknowledged")
print("published", count)
"""


def test_reliable_delivery_in_order_across_processes(bridge):
    topic, count = unique_topic("commands"), 200
    subscription = bridge.subscription(topic, Float64MultiArray, QoSProfile(depth=count))
    other_domain = make_bridge("dds", domain_id=45)
    elsewhere = other_domain.subscription(topic, Float64MultiArray, QoSProfile(depth=count))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER_PROCESS, topic, str(count)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        received = collect(subscription, count, timeout=20.0)
        _, err = process.communicate(timeout=20.0)
        crossed_domains = elsewhere.publisher_count()
    finally:
        process.kill()
        other_domain.close()
    assert process.returncode == 0, err[-2000:]
    assert [r.msg.data for r in received] == [[float(i), i * 0.5] for i in range(count)]
    assert crossed_domains == 0 and elsewhere.take() == []  # same topic, another domain id: nothing crosses
    assert wait_until(lambda: subscription.publisher_count() == 0)  # the publisher's process is gone


def test_best_effort_delivers(bridge):
    topic = unique_topic("best_effort")
    subscription = bridge.subscription(topic, Bool, SENSOR_DATA)
    publisher = bridge.publisher(topic, Bool, QoSProfile(depth=1, reliability=Reliability.BEST_EFFORT))

    def arrived() -> bool:
        publisher.publish(Bool(data=True))
        return subscription.wait(0.05)

    assert wait_until(arrived)
    assert subscription.latest().msg == Bool(data=True)


def test_transient_local_reaches_late_joiners_volatile_does_not(bridge):
    topic = unique_topic("latched")
    publisher = bridge.publisher(topic, Float64MultiArray, LATCHED)
    for i in range(3):
        publisher.publish(Float64MultiArray(data=[float(i)]))
    with make_bridge("dds") as late:
        latched = late.subscription(topic, Float64MultiArray, LATCHED)
        volatile = late.subscription(topic, Float64MultiArray, DEFAULT)
        (last,) = collect(latched, 1)
        assert last.msg.data == [2.0]  # depth 1: only the newest is kept for late joiners
        assert wait_until(lambda: volatile.publisher_count() == 1)
        publisher.publish(Float64MultiArray(data=[3.0]))
        # the volatile subscription gets what is published after it joined, and nothing from before
        assert [r.msg.data for r in collect(volatile, 1)] == [[3.0]]
        assert volatile.take() == []
        assert [r.msg.data for r in collect(latched, 1)] == [[3.0]]


def test_domains_do_not_see_each_other():
    topic = unique_topic("domains")
    with (
        make_bridge("dds", domain_id=41) as a,
        make_bridge("dds", domain_id=41) as same,
        make_bridge("dds", domain_id=42) as other,
    ):
        publisher = a.publisher(topic, Bool, DEFAULT)
        in_domain = same.subscription(topic, Bool, DEFAULT)
        elsewhere = other.subscription(topic, Bool, DEFAULT)
        assert wait_until(lambda: in_domain.publisher_count() == 1)
        publisher.publish(Bool(data=True))
        assert collect(in_domain, 1)[0].msg.data is True
        assert publisher.wait_for_all_acked(5.0)
        assert publisher.subscription_count() == 1
        assert elsewhere.publisher_count() == 0 and elsewhere.take() == []


@pytest.mark.parametrize(
    ("topic", "complaint"),
    [
        ("", "names no topic"),
        ("/", "names no topic"),
        ("/arm//command", "'//'"),
        ("/arm/", "end with '/'"),
        ("/arm/9joint", "'9joint' starts with a digit"),
        ("/arm/joint states", "'joint states'"),
        ("/arm-1/cmd", "'arm-1'"),
        ("~/private", "need a node"),
        ("/{ns}/cmd", "need a node"),
        ("/" + "a" * 300, "at most 247"),
    ],
)
def test_bad_topic_is_refused_by_name(bridge, topic, complaint):
    for make in (bridge.publisher, bridge.subscription):
        with pytest.raises(ValueError, match="invalid ROS 2 topic name") as error:
            make(topic, Bool)
        assert complaint in str(error.value) and repr(topic)[:40] in str(error.value)


def test_bad_inputs_are_refused_by_name(bridge):
    with pytest.raises(ValueError, match="depth must be an integer >= 1, got 0"):
        QoSProfile(depth=0)
    with pytest.raises(ValueError, match="depth must be an integer >= 1, got True"):
        QoSProfile(depth=True)
    with pytest.raises(ValueError, match=r"reliability must be one of .* got 'sometimes'"):
        QoSProfile(reliability="sometimes")
    with pytest.raises(ValueError, match=r"durability must be one of .* got 'forever'"):
        QoSProfile(durability="forever")
    assert QoSProfile(reliability="best_effort", durability="transient_local").durability is Durability.TRANSIENT_LOCAL
    with pytest.raises(ValueError, match="got 'fast'"):
        bridge.publisher("/ok", Bool, "fast")
    assert bridge.publisher(unique_topic("preset"), Bool, "latched").qos == LATCHED
    for domain_id in (-1, 233, "0", True, 1.0):
        with pytest.raises(ValueError, match=f"domain id must be an integer in 0..232, got {domain_id!r}"):
            make_bridge("dds", domain_id=domain_id)
    with pytest.raises(ValueError, match="got 'ros1'"):
        make_bridge("ros1")
    with pytest.raises(TypeError, match="loopback must be True or False, got 'yes'"):
        make_bridge("dds", loopback="yes")
    with pytest.raises(TypeError, match="node_name"):
        make_bridge("dds", node_name="x")
    with pytest.raises(TypeError, match="dict"):
        bridge.publisher("/ok", dict)
    with pytest.raises(TypeError, match="callback for '/ok' must be callable"):
        bridge.subscription("/ok", Bool, callback=3)

    topic = unique_topic("typed")
    publisher = bridge.publisher(topic, Bool)
    with pytest.raises(TypeError, match=f"publisher on {topic} sends Bool, got JointState"):
        publisher.publish(JointState())
    with pytest.raises(TypeError, match=f"{topic} already carries Bool on this bridge, not JointState"):
        bridge.subscription(topic, JointState)
    with pytest.raises(ValueError, match="cannot publish Float64MultiArray on /robotrl_test/values_"):
        bridge.publisher(unique_topic("values"), Float64MultiArray).publish(Float64MultiArray(data=["a"]))


def test_one_configuration_per_domain_in_a_process(bridge):
    with pytest.raises(RuntimeError, match="domain 0 is already open in this process with loopback=True"):
        make_bridge("dds", domain_id=0, loopback=False)


def test_closed_bridge_refuses_and_close_is_idempotent():
    b = make_bridge("dds", domain_id=43)
    subscription = b.subscription(unique_topic("closing"), Bool)
    b.close()
    b.close()
    with pytest.raises(RuntimeError, match="dds bridge \\(domain 43\\) is closed"):
        b.publisher("/ok", Bool)
    assert subscription.take() == []
    with make_bridge("dds", domain_id=43):  # the domain can be opened again
        pass


def test_a_failing_callback_does_not_stop_delivery(bridge):
    topic = unique_topic("callback")

    def broken(msg):
        raise RuntimeError("user bug")

    failing = bridge.subscription(topic, Bool, callback=broken)
    healthy = bridge.subscription(topic, Bool)
    publisher = bridge.publisher(topic, Bool)
    assert wait_until(lambda: publisher.subscription_count() == 2)
    for value in (True, False):
        publisher.publish(Bool(data=value))
    assert [r.msg.data for r in collect(healthy, 2)] == [True, False]
    assert [r.msg.data for r in collect(failing, 2)] == [True, False]


def test_wire_is_ros2s():
    assert dds_topic_name("/joint_states") == "rt/joint_states"
    assert dds_topic_name("arm/command") == "rt/arm/command"
    assert JointState.__idl__.idl_transformed_typename == "sensor_msgs::msg::dds_::JointState_"
    qos = dds_qos(DEFAULT).asdict()
    assert qos["DataRepresentation"] == {"use_cdrv0_representation": True, "use_xcdrv2_representation": False}
    assert qos["History"] == {"kind": "KeepLast", "depth": 10}
    assert '<NetworkInterface name="lo"/>' in LOOPBACK_CONFIG
    assert "<AllowMulticast>false</AllowMulticast>" in LOOPBACK_CONFIG


@pytest.mark.skipif(rclpy_available(), reason="rclpy is importable here, so it cannot be missing")
def test_rclpy_backend_missing_says_what_to_do():
    with pytest.raises(ImportError, match=r"source /opt/ros/<distro>/setup.bash.*backend='dds'"):
        make_bridge("rclpy")
    with make_bridge("auto") as auto:
        assert auto.backend == "dds"


def test_rclpy_backend_pub_sub():
    pytest.importorskip("rclpy", reason="rclpy is not importable (source a ROS 2 install to run this)")
    topic = unique_topic("rclpy")
    with make_bridge("rclpy", domain_id=44, node_name="robotrl_test") as b:
        subscription = b.subscription(topic, JointState)
        publisher = b.publisher(topic, JointState)
        assert wait_until(lambda: publisher.subscription_count() == 1)
        publisher.publish(JointState(name=["a"], position=[1.0]))
        assert collect(subscription, 1)[0].msg.position == [1.0]


def test_rclpy_loopback_environment_is_put_back_after_init(monkeypatch):
    """rcl reads the discovery variables when a context is initialised: loopback sets them for that call
    only, so a later loopback=False bridge in the same process gets the user's settings (set or unset)."""
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "SUBNET")
    monkeypatch.setenv("ROS_STATIC_PEERS", "192.168.1.7")
    monkeypatch.delenv("ROS_LOCALHOST_ONLY", raising=False)
    user = {name: os.environ.get(name) for name in LOOPBACK_ENV}
    with discovery_environment(loopback=True):
        assert {name: os.environ.get(name) for name in LOOPBACK_ENV} == LOOPBACK_ENV
    assert {name: os.environ.get(name) for name in LOOPBACK_ENV} == user
    with pytest.raises(RuntimeError, match="init failed"), discovery_environment(loopback=True):
        raise RuntimeError("init failed")
    assert {name: os.environ.get(name) for name in LOOPBACK_ENV} == user
    with discovery_environment(loopback=False):
        assert {name: os.environ.get(name) for name in LOOPBACK_ENV} == user


def test_rclpy_loopback_does_not_outlive_its_bridge():
    pytest.importorskip("rclpy", reason="rclpy is not importable (source a ROS 2 install to run this)")
    before = {name: os.environ.get(name) for name in LOOPBACK_ENV}
    with make_bridge("rclpy", domain_id=206, loopback=True, node_name="robotrl_loopback_test"):
        assert {name: os.environ.get(name) for name in LOOPBACK_ENV} == before
    with make_bridge("rclpy", domain_id=206, loopback=False, node_name="robotrl_network_test"):
        assert {name: os.environ.get(name) for name in LOOPBACK_ENV} == before


class _FakeRosMessage:
    """Stands in for an rclpy message class: attributes only; sequences come back as arrays, as rclpy's do."""

    def __setattr__(self, name, value):
        if isinstance(value, list) and value and isinstance(value[0], float):
            value = array.array("d", value)
        super().__setattr__(name, value)


def test_rclpy_conversion_round_trips_every_message_type():
    classes = {cls: type(cls.__name__, (_FakeRosMessage,), {}) for cls in MESSAGE_TYPES.values()}
    samples = {
        JointState: JointState(name=["a", "b"], position=[1.0, 2.0], velocity=[0.5, 0.25]),
        Image: Image(height=1, width=2, encoding="mono8", step=2, data=b"\x01\x02"),
    }
    for cls in MESSAGE_TYPES.values():
        msg = samples.get(cls, cls())
        ros_msg = to_ros(msg, classes.__getitem__)
        assert type(ros_msg) is classes[cls]
        assert from_ros(ros_msg, cls) == msg
    assert to_ros(samples[Image], classes.__getitem__).data == array.array("B", b"\x01\x02")


IMPORT_CHECK = """
import sys
import robotrl.hardware.ros2
assert not any(m.split(".")[0] in ("cyclonedds", "rosbags", "rclpy") for m in sys.modules), "imported eagerly"
sys.modules["cyclonedds"] = None  # as if the ros extra were not installed
try:
    robotrl.hardware.ros2.make_bridge("dds")
except ImportError as error:
    print(error)
"""


def test_middleware_is_imported_lazily_and_its_absence_is_explained():
    result = subprocess.run([sys.executable, "-c", IMPORT_CHECK], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'pip install "robotrl[ros]"' in result.stdout
    core = [
        p
        for p in (REPO / "robotrl").rglob("*.py")
        if any(
            f"import {name}" in p.read_text() or f"from {name}" in p.read_text()
            for name in ("cyclonedds", "rosbags", "rclpy")
        )
    ]
    assert core == [], f"the core must not import ROS 2 middleware: {core}"
