"""StampClock: a message's measurement time on the monotonic clock, from its header stamp on another clock."""

from __future__ import annotations

import numpy as np
import pytest
from robotrl.hardware.state_clock import StampClock

OFFSET = 1.7e9 - 1234.5  # the sender's wall clock minus this machine's monotonic clock


def test_a_late_message_is_as_old_as_it_is_late_whatever_the_clock_offset():
    clock = StampClock(window=10.0)
    for i in range(100):  # 1 ms deliveries at 500 Hz
        sent = 1000.0 + i * 0.002
        assert clock.measured_at(sent + OFFSET, sent + 0.001) == pytest.approx(sent + 0.001)
    sent = 1000.2
    late = clock.measured_at(sent + OFFSET, sent + 0.151)  # delayed 150 ms beyond the fastest delivery
    assert late == pytest.approx(sent + 0.001, abs=1e-6)


def test_a_message_stamped_before_another_maps_before_it():
    clock = StampClock()
    first = clock.measured_at(OFFSET + 10.0, 10.001)
    overtaken = clock.measured_at(OFFSET + 9.99, 10.002)  # measured earlier, arrived later
    assert overtaken < first


def test_unstamped_messages_fall_back_to_their_arrival_and_the_window_forgets():
    clock = StampClock(window=1.0)
    assert clock.measured_at(0.0, 5.0) == 5.0
    assert clock.measured_at(float("nan"), 5.1) == 5.1
    for i in range(3):  # fast deliveries ...
        clock.measured_at(OFFSET + 10.0 + i * 0.001, 10.001 + i * 0.001)
    for i in range(1, 300):  # ... then the path slows for good (a new route): after the window, the new normal
        t = 10.0 + i * 0.01
        measured = clock.measured_at(OFFSET + t, t + 0.05)
    assert measured == pytest.approx(t + 0.05)
    with pytest.raises(ValueError, match="window"):
        StampClock(window=0.0)


def test_messages_arriving_in_stamp_order_keep_their_order_as_the_estimate_improves():
    """The first states arrive 100 ms late in a burst (a busy sender), then on time: the offset estimate
    falls, and still no message maps before the one that arrived before it."""
    clock = StampClock()
    times = [clock.measured_at(OFFSET + 10.0 + i * 0.004, 10.1 + i * 1e-5) for i in range(25)]
    times += [clock.measured_at(OFFSET + 10.1 + i * 0.004, 10.1005 + i * 0.004) for i in range(25)]
    assert (np.diff(times) >= 0).all()
    assert times[-1] == pytest.approx(10.1005 + 24 * 0.004)  # the fast delivery is the clock's offset now


def test_one_message_stamped_far_ahead_does_not_age_the_messages_after_it():
    """A sender that once stamps 5 s ahead (a clock glitch): with the fastest single delivery as the offset,
    every later state looked 5 s old and the arm stopped for the whole window."""
    clock = StampClock()
    for i in range(50):
        t = 10.0 + i * 0.002
        clock.measured_at(OFFSET + t, t + 0.001)
    clock.measured_at(OFFSET + 10.1 + 5.0, 10.101)
    t = 10.102
    assert clock.measured_at(OFFSET + t, t + 0.001) == pytest.approx(t + 0.001)
