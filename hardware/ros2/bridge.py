"""One publish/subscribe interface to ROS 2, whichever backend carries it (Cyclone DDS or rclpy).

    bridge = make_bridge()                        # "auto": rclpy when importable, else Cyclone DDS
    joints = bridge.subscription("/joint_states", JointState, SENSOR_DATA)
    command = bridge.publisher("/arm/command", Float64MultiArray)
    ...
    state = joints.latest()                       # Received(msg, received_at, source_time) or None
    bridge.close()

Every public input is checked here, before a backend sees it: topic names by ROS 2's rules, message
types (only those of `msgs`), QoS profiles, callbacks, domain ids.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from robotrl.hardware.ros2.names import check_domain_id, full_topic_name
from robotrl.hardware.ros2.qos import DEFAULT, QoSProfile, resolve_qos

log = logging.getLogger(__name__)

M = TypeVar("M")
BACKENDS = ("auto", "dds", "rclpy")


@dataclass(frozen=True)
class Received(Generic[M]):
    msg: M
    received_at: float
    """time.monotonic() when the bridge took the message from the middleware."""
    source_time: float | None
    """The publisher's clock (seconds since the epoch) when it wrote the message, where the middleware says."""
    publisher: int | None = None
    """Which publisher wrote it (an id matching `Subscription.matched_publishers`), where the middleware says."""

    def age(self) -> float:
        return time.monotonic() - self.received_at


@dataclass(frozen=True)
class OnReceived(Generic[M]):
    """A subscription callback that is given the whole `Received` (source time, publisher), not the message:
    `bridge.subscription(topic, Bool, qos, OnReceived(function))`."""

    function: Callable[[Received[M]], Any]


class Publisher(ABC, Generic[M]):
    def __init__(self, topic: str, msg_type: type[M], qos: QoSProfile):
        self.topic = topic
        self.msg_type = msg_type
        self.qos = qos

    def publish(self, msg: M) -> None:
        if not isinstance(msg, self.msg_type):
            raise TypeError(f"publisher on {self.topic} sends {self.msg_type.__name__}, got {type(msg).__name__}")
        self._publish(msg)

    @abstractmethod
    def _publish(self, msg: M) -> None: ...

    @abstractmethod
    def subscription_count(self) -> int:
        """How many subscriptions are matched with this publisher now."""

    @abstractmethod
    def wait_for_all_acked(self, timeout: float) -> bool:
        """Block until every reliable subscription has acknowledged all messages, or `timeout` seconds pass."""


class Subscription(ABC, Generic[M]):
    """The newest messages of one topic, kept as a keep-last queue of the profile's depth.

    Backends hand each message to `_deliver` from their receive thread; `callback`, if given, runs there
    too (keep it short). `latest()` reads without consuming; `take()` consumes what has arrived."""

    def __init__(self, topic: str, msg_type: type[M], qos: QoSProfile, callback: Callable[[M], Any] | None):
        self.topic = topic
        self.msg_type = msg_type
        self.qos = qos
        self._callback = callback
        self._queue: deque[Received[M]] = deque(maxlen=qos.depth)
        self._latest: Received[M] | None = None
        self._arrived = threading.Condition()

    def latest(self) -> Received[M] | None:
        """The newest message received so far (taken or not), or None before the first."""
        return self._latest

    def take(self) -> list[Received[M]]:
        """Messages received since the last take, oldest first (at most `qos.depth`: older ones are dropped)."""
        with self._arrived:
            taken = list(self._queue)
            self._queue.clear()
        return taken

    def wait(self, timeout: float) -> bool:
        """Block until a message is waiting to be taken, or `timeout` seconds pass; True if one is."""
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self._queue) > 0, timeout)

    @abstractmethod
    def publisher_count(self) -> int:
        """How many publishers are matched with this subscription now."""

    def matched_publishers(self) -> set[int] | None:
        """The ids of the publishers matched with this subscription now (alive), or None where the backend
        cannot tell publishers apart (then every message counts as from one publisher, id None)."""
        return None

    def poll(self) -> None:
        """Take what has arrived into the queue now, from the calling thread. A control loop calls this before
        it judges a message's age: the receive thread may not have run yet (it waits for the GIL like any
        Python thread), and a message that has arrived must not look stale because of that. Backends whose
        executor delivers on its own do nothing here."""

    def _deliver(self, msg: M, source_time: float | None, publisher: int | None = None) -> None:
        received = Received(msg, time.monotonic(), source_time, publisher)
        with self._arrived:
            self._queue.append(received)
            self._latest = received
            self._arrived.notify_all()
        if self._callback is not None:
            try:
                if isinstance(self._callback, OnReceived):
                    self._callback.function(received)
                else:
                    self._callback(msg)
            except Exception:  # one bad callback must not stop the receive thread for every topic
                log.exception("callback of the subscription on %s failed", self.topic)


class Bridge(ABC):
    """Publishers and subscriptions on one ROS 2 domain. Close it (or use `with`) to leave the domain."""

    backend: str

    def __init__(self, domain_id: int):
        self.domain_id = domain_id
        self._closed = False

    def publisher(self, topic: str, msg_type: type[M], qos: QoSProfile | str = DEFAULT) -> Publisher[M]:
        self._check_open()
        return self._create_publisher(full_topic_name(topic), _check_msg_type(msg_type), resolve_qos(qos))

    def subscription(
        self,
        topic: str,
        msg_type: type[M],
        qos: QoSProfile | str = DEFAULT,
        callback: Callable[[M], Any] | OnReceived[M] | None = None,
    ) -> Subscription[M]:
        self._check_open()
        if callback is not None and not callable(callback) and not isinstance(callback, OnReceived):
            raise TypeError(f"callback for {topic!r} must be callable, OnReceived or None, got {callback!r}")
        return self._create_subscription(full_topic_name(topic), _check_msg_type(msg_type), resolve_qos(qos), callback)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {self.backend} bridge (domain {self.domain_id}) is closed")

    @abstractmethod
    def _create_publisher(self, topic: str, msg_type: type[M], qos: QoSProfile) -> Publisher[M]: ...

    @abstractmethod
    def _create_subscription(
        self, topic: str, msg_type: type[M], qos: QoSProfile, callback: Callable[[M], Any] | None
    ) -> Subscription[M]: ...

    @abstractmethod
    def _close(self) -> None: ...


def _check_msg_type(msg_type: type) -> type:
    from robotrl.hardware.ros2.msgs import ros_type_name  # cyclonedds (the ros extra) loads with the message types

    ros_type_name(msg_type)  # a TypeError naming the known messages for anything else
    return msg_type


def rclpy_available() -> bool:
    return importlib.util.find_spec("rclpy") is not None


def make_bridge(backend: str = "auto", domain_id: int = 0, loopback: bool = True, **options: Any) -> Bridge:
    """A bridge on ROS 2 domain `domain_id`.

    backend: "dds" (Cyclone DDS, no ROS install needed), "rclpy" (a sourced ROS 2), or "auto" (rclpy when
    importable, else dds). loopback: stay on this machine (interface `lo`, no multicast) so tests and
    first runs never reach the lab network; False uses the middleware's own configuration (CYCLONEDDS_URI
    for dds). `options` go to the backend (rclpy: `node_name`).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    check_domain_id(domain_id)
    if not isinstance(loopback, bool):
        raise TypeError(f"loopback must be True or False, got {loopback!r}")
    if backend == "auto":
        backend = "rclpy" if rclpy_available() else "dds"
    if backend == "rclpy":
        from robotrl.hardware.ros2.rclpy_backend import RclpyBridge  # rclpy: a sourced ROS 2 only

        return RclpyBridge(domain_id, loopback=loopback, **options)
    if options:
        raise TypeError(f"the dds backend takes no options, got {sorted(options)}")
    from robotrl.hardware.ros2.dds_backend import DdsBridge  # cyclonedds, the ros extra

    return DdsBridge(domain_id, loopback=loopback)
