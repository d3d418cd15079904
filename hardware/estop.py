"""The e-stop topic as a robot hears it: pressed while any live publisher on it says pressed.

A std_msgs/Bool topic may have several publishers (the button's node, a dashboard, `ros2 topic pub`). The
last message received is not the button's state: one publisher presses, another sends false, and the arm
would restart while the button is still down. `EStopInput` keeps what each publisher said last and counts
only publishers that are still matched (alive); a publisher that goes away takes its word with it (a press
it made has latched the shield already, and releasing that latch needs an acknowledgement). Backends that
cannot tell publishers apart (rclpy before publisher ids) fall back to the newest message.

Who may publish on the e-stop and acknowledgement topics is a deployment's decision: with SROS2, grant
publish on `rt/estop` to the button's node and on `rt/estop_ack` to the operator's console only
(docs/architecture.md, "E-stop").
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from robotrl.hardware.ros2.bridge import OnReceived
from robotrl.hardware.ros2.qos import Durability, QoSProfile

# An e-stop reader keeps every message of a burst until it is taken: a depth-1 reader let a quick release
# overwrite its press before the receive thread got to it (a process busy for a moment lost short presses).
ESTOP_DEPTH = 10
ESTOP_LATCHED_QOS = QoSProfile(depth=ESTOP_DEPTH, durability=Durability.TRANSIENT_LOCAL)
ESTOP_VOLATILE_QOS = QoSProfile(depth=ESTOP_DEPTH)


def subscribe_estop(bridge: Any, topic: str, callback: Callable[[Any], Any]) -> list:
    """Two readers of an e-stop topic (std_msgs/Bool), both calling `callback` with each message's `Received`
    (the message, its source time and publisher). The transient-local one hears latched publishers, and a
    press made before it joined; the volatile one hears publishers with ROS 2's default QoS (`ros2 topic
    pub`, `create_publisher(topic, 10)`), which a transient-local reader never matches. A latched publisher
    reaches both readers: a message seen already (same publisher, source time and value, where the backend
    reports the source time) is passed on once. Best-effort publishers match neither: an e-stop must be
    reliable."""
    from robotrl.hardware.ros2.msgs import Bool  # cyclonedds (the ros extra) loads with the message types

    seen: deque[tuple[int | None, float, bool]] = deque(maxlen=4 * ESTOP_DEPTH)
    lock = threading.Lock()

    def heard(received) -> None:
        if received.source_time is not None:
            key = (received.publisher, received.source_time, bool(received.msg.data))
            with lock:
                if key in seen:
                    return
                seen.append(key)
        callback(received)

    return [bridge.subscription(topic, Bool, qos, OnReceived(heard)) for qos in (ESTOP_LATCHED_QOS, ESTOP_VOLATILE_QOS)]


class EStopVotes:
    """Each publisher's last word on the e-stop: pressed while any live publisher's last word was true."""

    def __init__(self):
        self._said: dict[int | None, bool] = {}
        self._lock = threading.Lock()

    def record(self, publisher: int | None, pressed: bool) -> None:
        with self._lock:
            self._said[publisher] = bool(pressed)

    def pressed(self, live: set[int | None] | None) -> bool:
        """`live`: the publishers matched now (only their words count), or None where publishers cannot be
        told apart (every word counts). Nothing is forgotten here: a publisher that matched after `live` was
        read keeps its word for the next call."""
        with self._lock:
            return any(word for publisher, word in self._said.items() if live is None or publisher in live)

    def silent(self, live: set[int | None]) -> set[int | None]:
        """Live publishers that have said nothing yet: whether their button is pressed is not known."""
        with self._lock:
            return live - set(self._said)

    def __len__(self) -> int:
        return len(self._said)


class EStopInput:
    """The e-stop state from every live publisher on `topic`; `on_change(pressed)` is called with the state
    after each message (the shield latches on every press, so it hears each one)."""

    def __init__(self, bridge: Any, topic: str, on_change: Callable[[bool], None]):
        self.topic = topic
        self._on_change = on_change
        self.votes = EStopVotes()
        self.subscriptions: list = []  # a latched press may be heard before both readers exist
        self.subscriptions = subscribe_estop(bridge, topic, self._heard)

    def live_publishers(self) -> set[int | None] | None:
        """Ids of the publishers matched now (None: the backend cannot tell them apart, or the readers are
        still being made)."""
        if not self.subscriptions:
            return None
        live: set[int | None] = set()
        for subscription in self.subscriptions:
            matched = subscription.matched_publishers()
            if matched is None:
                return None
            live |= matched
        return live

    def has_publisher(self) -> bool:
        return any(subscription.publisher_count() for subscription in self.subscriptions)

    def not_known_released(self) -> str | None:
        """Why the e-stop cannot be taken as released for a restart (None: every live publisher has said
        false): a publisher says pressed, or has said nothing since this reader joined (a button that
        publishes only on change, pressed before), or the backend cannot tell publishers apart."""
        live = self.live_publishers()
        if live is None:
            return (
                f"this bridge cannot tell the publishers on {self.topic} apart, so one saying released could hide "
                "another saying pressed: use hardware.backend=dds (ROS 2 nodes on rmw_cyclonedds_cpp hear it)"
            )
        if self.votes.pressed(live):
            return f"the e-stop is still pressed (a publisher on {self.topic} says so)"
        silent = self.votes.silent(live)
        if silent:
            return (
                f"{len(silent)} publisher(s) on {self.topic} have not said whether the e-stop is pressed since this "
                "env joined: publish it latched, or repeat it"
            )
        return None

    @property
    def pressed(self) -> bool:
        """Any live publisher's last message was true."""
        return self.votes.pressed(self.live_publishers())

    def _heard(self, received) -> None:
        self.votes.record(received.publisher, received.msg.data)
        # a press always reaches the shield, even from a publisher gone by the time it is read
        self._on_change(bool(received.msg.data) or self.pressed)
