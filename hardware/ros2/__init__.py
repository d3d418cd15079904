"""ROS 2 bridge: ROS 2 messages, QoS profiles and one publish/subscribe interface over Cyclone DDS (wire-
compatible with ROS 2 nodes, no ROS install needed) or rclpy (when importable).

Importing this package needs neither cyclonedds nor rclpy; `msgs` and `make_bridge` import them on use
(`pip install "robotrl[ros]"`).
"""

from __future__ import annotations

from robotrl.hardware.ros2.bridge import Bridge, Publisher, Received, Subscription, make_bridge
from robotrl.hardware.ros2.qos import DEFAULT, LATCHED, SENSOR_DATA, Durability, QoSProfile, Reliability

__all__ = [
    "DEFAULT",
    "LATCHED",
    "SENSOR_DATA",
    "Bridge",
    "Durability",
    "Publisher",
    "QoSProfile",
    "Received",
    "Reliability",
    "Subscription",
    "make_bridge",
]
