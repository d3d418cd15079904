"""The bridge over rclpy, for machines with a sourced ROS 2: the same interface as the DDS backend, with
messages converted field by field between `msgs` and the ROS 2 Python message classes.

rclpy is imported when a bridge is made; it spins its own node on a background executor thread.
"""

from __future__ import annotations

import array
import importlib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from robotrl.hardware.ros2.bridge import Bridge, Publisher, Subscription
from robotrl.hardware.ros2.msgs import message_fields, ros_type_name
from robotrl.hardware.ros2.qos import Durability, QoSProfile, Reliability

M = TypeVar("M")

RCLPY_HINT = (
    "backend='rclpy' needs rclpy, which is not importable here: source your ROS 2 install first "
    "(`source /opt/ros/<distro>/setup.bash`, the same Python version as ROS), or use backend='dds' "
    '(Cyclone DDS, wire-compatible with ROS 2 nodes, `pip install "robotrl[ros]"`)'
)


# What keeps a ROS 2 context on this machine: ROS_LOCALHOST_ONLY (Humble), ROS_AUTOMATIC_DISCOVERY_RANGE and
# no ROS_STATIC_PEERS (Jazzy on). rcl reads them once, when a context is initialised (rcl_init).
LOOPBACK_ENV = {"ROS_LOCALHOST_ONLY": "1", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_STATIC_PEERS": ""}
_environment_lock = threading.Lock()


@contextmanager
def discovery_environment(loopback: bool) -> Iterator[None]:
    """With loopback, LOOPBACK_ENV in the process environment for the duration (the previous values, or their
    absence, are put back after), so a later loopback=False bridge in this process gets the user's own
    settings; without loopback the environment is left as the user set it."""
    if not loopback:
        yield
        return
    with _environment_lock:
        saved = {name: os.environ.get(name) for name in LOOPBACK_ENV}
        os.environ.update(LOOPBACK_ENV)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def import_rclpy() -> Any:
    try:
        return importlib.import_module("rclpy")
    except ImportError as error:
        raise ImportError(f"{RCLPY_HINT} ({error})") from error


def ros_message_class(msg_type: type) -> type:
    """The rclpy message class of one of our messages: JointState -> sensor_msgs.msg.JointState."""
    package, _, name = ros_type_name(msg_type).split("/")
    try:
        return getattr(importlib.import_module(f"{package}.msg"), name)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"the ROS 2 message {package}/msg/{name} is not importable: {RCLPY_HINT}") from error


def to_ros(msg: Any, ros_class_for: Callable[[type], type] = ros_message_class) -> Any:
    out = ros_class_for(type(msg))()
    for name, (nested, is_sequence) in message_fields(type(msg)).items():
        value = getattr(msg, name)
        if nested is not None:
            value = [to_ros(v, ros_class_for) for v in value] if is_sequence else to_ros(value, ros_class_for)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            value = array.array("B", bytes(value))  # rclpy's fast path for uint8[]
        setattr(out, name, value)
    return out


def from_ros(ros_msg: Any, msg_type: type[M]) -> M:
    values = {}
    for name, (nested, is_sequence) in message_fields(msg_type).items():
        value = getattr(ros_msg, name)
        if nested is not None:
            value = [from_ros(v, nested) for v in value] if is_sequence else from_ros(value, nested)
        elif isinstance(value, array.array) and value.typecode == "B":
            value = value.tobytes()
        elif is_sequence:
            value = list(value)
        values[name] = value
    return msg_type(**values)


def rclpy_qos(profile: QoSProfile) -> Any:
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, ReliabilityPolicy
    from rclpy.qos import QoSProfile as RclpyQoSProfile

    return RclpyQoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=profile.depth,
        reliability=ReliabilityPolicy.RELIABLE
        if profile.reliability is Reliability.RELIABLE
        else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL
        if profile.durability is Durability.TRANSIENT_LOCAL
        else DurabilityPolicy.VOLATILE,
    )


class RclpyPublisher(Publisher[M]):
    def __init__(self, topic: str, msg_type: type[M], qos: QoSProfile, publisher: Any):
        super().__init__(topic, msg_type, qos)
        self._publisher = publisher

    def _publish(self, msg: M) -> None:
        self._publisher.publish(to_ros(msg))

    def subscription_count(self) -> int:
        return self._publisher.get_subscription_count()

    def wait_for_all_acked(self, timeout: float) -> bool:
        from rclpy.duration import Duration

        return self._publisher.wait_for_all_acked(Duration(nanoseconds=int(timeout * 1e9)))


class RclpySubscription(Subscription[M]):
    def __init__(self, topic: str, msg_type: type[M], qos: QoSProfile, callback: Any, node: Any):
        super().__init__(topic, msg_type, qos, callback)
        self._node = node

    def on_message(self, ros_msg: Any) -> None:
        self._deliver(from_ros(ros_msg, self.msg_type), None)

    def publisher_count(self) -> int:
        return self._node.count_publishers(self.topic)


class RclpyBridge(Bridge):
    backend = "rclpy"

    def __init__(self, domain_id: int, loopback: bool = True, node_name: str = "robotrl_bridge"):
        super().__init__(domain_id)
        rclpy = import_rclpy()
        from rclpy.executors import SingleThreadedExecutor

        self._context = rclpy.Context()
        with discovery_environment(loopback):
            rclpy.init(context=self._context, domain_id=domain_id)
        self._node = rclpy.create_node(node_name, context=self._context)
        self._executor = SingleThreadedExecutor(context=self._context)
        self._executor.add_node(self._node)
        self._spinner = threading.Thread(target=self._executor.spin, name="robotrl-rclpy-spin", daemon=True)
        self._spinner.start()

    def _create_publisher(self, topic: str, msg_type: type[M], qos: QoSProfile) -> RclpyPublisher[M]:
        publisher = self._node.create_publisher(ros_message_class(msg_type), topic, rclpy_qos(qos))
        return RclpyPublisher(topic, msg_type, qos, publisher)

    def _create_subscription(
        self, topic: str, msg_type: type[M], qos: QoSProfile, callback: Callable[[M], Any] | None
    ) -> RclpySubscription[M]:
        subscription = RclpySubscription(topic, msg_type, qos, callback, self._node)
        self._node.create_subscription(ros_message_class(msg_type), topic, subscription.on_message, rclpy_qos(qos))
        return subscription

    def _close(self) -> None:
        self._executor.shutdown()
        self._spinner.join(timeout=5.0)
        self._node.destroy_node()
        self._context.try_shutdown()
