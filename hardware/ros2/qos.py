"""Quality of service for bridge topics, named as rclpy names it (`QoSProfile`, reliability, durability,
keep-last depth), with rclpy's presets."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Reliability(str, Enum):
    RELIABLE = "reliable"
    BEST_EFFORT = "best_effort"


class Durability(str, Enum):
    VOLATILE = "volatile"
    TRANSIENT_LOCAL = "transient_local"  # late joiners get the last `depth` messages ("latched")


@dataclass(frozen=True)
class QoSProfile:
    """Keep-last history of `depth` messages; `reliability` and `durability` take the enums or their values."""

    depth: int = 10
    reliability: Reliability = Reliability.RELIABLE
    durability: Durability = Durability.VOLATILE

    def __post_init__(self) -> None:
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValueError(f"QoS depth must be an integer >= 1, got {self.depth!r}")
        object.__setattr__(self, "reliability", _member(Reliability, self.reliability, "reliability"))
        object.__setattr__(self, "durability", _member(Durability, self.durability, "durability"))


def _member(enum: type[Enum], value: object, what: str) -> Enum:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum)
        raise ValueError(f"QoS {what} must be one of {allowed}, got {value!r}") from None


SENSOR_DATA = QoSProfile(depth=5, reliability=Reliability.BEST_EFFORT)
"""rclpy's qos_profile_sensor_data: the newest sample matters, a lost one is not resent."""
DEFAULT = QoSProfile(depth=10)
"""rclpy's default for publishers and subscriptions: reliable, volatile, depth 10."""
LATCHED = QoSProfile(depth=1, durability=Durability.TRANSIENT_LOCAL)
"""The last message is kept for subscribers that join later (robot descriptions, goals, modes)."""

PRESETS = {"sensor_data": SENSOR_DATA, "default": DEFAULT, "latched": LATCHED}


def resolve_qos(qos: QoSProfile | str) -> QoSProfile:
    """A profile, or a preset's name (`"sensor_data"`, `"default"`, `"latched"`, as a config may give it)."""
    if isinstance(qos, QoSProfile):
        return qos
    if isinstance(qos, str) and qos in PRESETS:
        return PRESETS[qos]
    raise ValueError(f"qos must be a QoSProfile or one of {', '.join(map(repr, PRESETS))}, got {qos!r}")
