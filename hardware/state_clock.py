"""When a sensor message was measured, on this machine's monotonic clock, from the message's own stamp.

Arrival time is not measurement time: a message delayed 150 ms in a queue or a relay arrives looking fresh,
and a message overtaken by a newer one arrives after it. The header stamp says when the driver measured it,
but on the driver's clock (ROS time, usually the wall clock of another PC). `StampClock` maps it onto the
monotonic clock without assuming the clocks agree: the smallest arrival-minus-stamp seen over the last
`window` seconds is taken as the clocks' offset plus the fastest delivery, and a message's measurement time
is its arrival time less whatever delay it had beyond that. A late message is therefore as old as it is
late; a message stamped before an earlier one maps before it (the shield refuses it), and messages that
arrive in stamp order keep their order.

A delivery counts as fast only when the two messages before it were about as fast (the largest of three
delays in a row): one message stamped seconds ahead would otherwise make every later one look seconds old
and stop the arm for a whole window. A sender whose clock steps back makes its states look older until the
window has passed (2 s: the arm holds meanwhile). What this cannot see is a delay every message has,
constant over the window: only synchronized clocks (PTP, chrony) could.
"""

from __future__ import annotations

import math
from collections import deque

DEFAULT_WINDOW = 2.0  # s: holds many fast deliveries at a robot's state rates; clock drift (ppm) is nil over it
CONFIRMING = 3  # delays in a row whose largest may set the fastest delivery


class StampClock:
    def __init__(self, window: float = DEFAULT_WINDOW):
        if not (math.isfinite(window) and window > 0):
            raise ValueError(f"StampClock window must be > 0 seconds, got {window!r}")
        self.window = window
        self._delays: deque[tuple[float, float]] = deque()  # (arrival, delay), delays increasing: a min-queue
        self._recent: deque[float] = deque(maxlen=CONFIRMING)

    def measured_at(self, header_stamp: float, received_at: float) -> float:
        """The monotonic time the message was measured. `header_stamp` in seconds on the sender's clock
        (0 or not finite: the driver does not stamp, and the arrival time is all there is)."""
        if not math.isfinite(header_stamp) or header_stamp <= 0:
            return received_at
        delay = received_at - header_stamp
        self._recent.append(delay)
        confirmed = max(self._recent)  # a delay as short as this was seen CONFIRMING times in a row
        delays = self._delays
        while delays and delays[-1][1] >= confirmed:
            delays.pop()
        delays.append((received_at, confirmed))
        while delays[0][0] < received_at - self.window:
            delays.popleft()
        return received_at - max(0.0, delay - delays[0][1])
