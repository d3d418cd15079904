"""How old the joint state is: fresh, hold (older than `hold_after`) or stop (older than `stop_after`)."""

from __future__ import annotations

import math
from enum import Enum


class StateAge(Enum):
    FRESH = "fresh"
    HOLD = "hold"
    STOP = "stop"


class StateWatchdog:
    def __init__(self, hold_after: float, stop_after: float):
        self.hold_after = hold_after
        self.stop_after = stop_after

    def classify(self, state_stamp: float | None, now: float) -> StateAge:
        """A missing stamp counts as infinitely old. A stamp from the future beyond `hold_after` also means
        stop: the two clocks differ (say ROS wall time against a monotonic clock) and age cannot be told."""
        if state_stamp is None or not math.isfinite(state_stamp):
            return StateAge.STOP
        age = now - state_stamp
        if age < -self.hold_after or age > self.stop_after:
            return StateAge.STOP
        if age > self.hold_after:
            return StateAge.HOLD
        return StateAge.FRESH
