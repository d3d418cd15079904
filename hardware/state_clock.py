"""When a sensor message was measured, on this machine's monotonic clock, from the message's own stamp.

Arrival time is not measurement time: a message delayed 150 ms in a queue or a relay arrives looking fresh,
and a message overtaken by a newer one arrives after it. The header stamp says when the driver measured it,
but on the driver's clock (ROS time, usually the wall clock of another PC). `StampClock` maps it onto the
monotonic clock without assuming the clocks agree: the smallest arrival-minus-stamp seen over the last
`window` seconds is taken as the clocks' offset plus the fastest delivery, and a message's measurement time
is its arrival time less whatever delay it had beyond that. A late message is therefore as old as it is
late; a message stamped before an earlier one maps before it (the shield refuses it), and messages that
arrive in stamp order keep their order (a lower offset estimate comes from the message that lowers it, which
maps to its own arrival). What this cannot see is a delay every message has, constant over the window: only
synchronized clocks (PTP, chrony) could.
"""

from __future__ import annotations

import math
from collections import deque

DEFAULT_WINDOW = 10.0  # s: long enough to contain a fast delivery, short enough that clock drift (ppm) is nil


class StampClock:
    def __init__(self, window: float = DEFAULT_WINDOW):
        if not (math.isfinite(window) and window > 0):
            raise ValueError(f"StampClock window must be > 0 seconds, got {window!r}")
        self.window = window
        self._delays: deque[tuple[float, float]] = deque()  # (arrival, delay), delays increasing: a min-queue

    def measured_at(self, header_stamp: float, received_at: float) -> float:
        """The monotonic time the message was measured. `header_stamp` in seconds on the sender's clock
        (0 or not finite: the driver does not stamp, and the arrival time is all there is)."""
        if not math.isfinite(header_stamp) or header_stamp <= 0:
            return received_at
        delay = received_at - header_stamp
        delays = self._delays
        while delays and delays[-1][1] >= delay:
            delays.pop()
        delays.append((received_at, delay))
        while delays[0][0] < received_at - self.window:
            delays.popleft()
        return received_at - (delay - delays[0][1])
