"""Action smoothness figures: known signals give known answers; episode boundaries are never crossed."""

import math

import pytest
import torch

from robotrl.runtime.smoothness import ActionSmoothness, high_frequency_share, mean_squared_difference


def _starts(T, E, every=None):
    starts = torch.zeros(T, E, dtype=torch.bool)
    starts[0] = True
    if every:
        starts[::every] = True
    return starts


def test_mean_squared_difference_of_known_signals():
    ramp = torch.arange(10.0)[:, None, None].expand(10, 2, 3)  # +1 per step
    assert float(mean_squared_difference(ramp, _starts(10, 2))) == pytest.approx(1.0)
    noise = torch.randn(4000, 2, 3)
    assert float(mean_squared_difference(noise, _starts(4000, 2))) == pytest.approx(2.0, rel=0.05)


def test_jumps_at_episode_starts_are_not_counted():
    actions = torch.zeros(20, 1, 2)
    actions[10:] = 1.0  # a new episode starts at step 10 with a different action
    starts = _starts(20, 1)
    starts[10] = True
    assert float(mean_squared_difference(actions, starts)) == 0.0
    starts[10] = False
    assert float(mean_squared_difference(actions, starts)) == pytest.approx(
        1 / 19
    )  # one jump of 1 in 19 pairs (mean over action dims)


def test_high_frequency_share_of_white_noise_slow_and_fast_sines():
    t = torch.arange(512.0)[:, None, None]
    starts = _starts(512, 1)
    assert float(high_frequency_share(torch.randn(512, 3, 2), _starts(512, 3))) == pytest.approx(0.5, abs=0.05)
    assert float(high_frequency_share(torch.sin(2 * math.pi * 0.05 * t), starts)) < 1e-3
    assert float(high_frequency_share(torch.sin(2 * math.pi * 0.4 * t), starts)) > 0.99
    assert float(high_frequency_share(torch.ones(512, 1, 1), starts)) == 0.0


def test_high_frequency_share_uses_only_segments_inside_one_episode():
    t = torch.arange(256.0)[:, None, None]
    slow = torch.sin(2 * math.pi * 0.03 * t) + torch.where(t < 128, 0.0, 5.0)  # a jump at the reset
    starts = _starts(256, 1)
    starts[128] = True
    assert float(high_frequency_share(slow, starts)) < 1e-3
    starts[128] = False
    assert float(high_frequency_share(slow, starts)) > 1e-2
    assert math.isnan(float(high_frequency_share(slow[:16], starts[:16])))  # shorter than a segment


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"actions must be a \[T, E, A\] tensor"):
        mean_squared_difference(torch.zeros(5, 2), torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"episode_start must be a bool tensor of shape \[5, 2\]"):
        mean_squared_difference(torch.zeros(5, 2, 1), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="cutoff must be in"):
        high_frequency_share(torch.zeros(64, 1, 1), _starts(64, 1), cutoff=0.5)
    with pytest.raises(ValueError, match="cutoff must be in"):
        ActionSmoothness(cutoff=0.0)
    with pytest.raises(ValueError, match=r"expected action \[E, A\]"):
        ActionSmoothness().add(torch.zeros(2, 3), torch.zeros(3, dtype=torch.bool))


def test_recorder_reports_what_it_can_and_clears():
    recorder = ActionSmoothness()
    assert recorder.flush() == {}
    for t in range(8):
        recorder.add(torch.full((2, 1), float(t)), torch.tensor([t == 0, t == 0]))
    assert recorder.flush() == {"action_sq_diff": 1.0}  # too short for a spectrum
    for t in range(64):
        recorder.add(torch.randn(2, 1), torch.tensor([t == 0, False]))
    figures = recorder.flush()
    assert set(figures) == {"action_sq_diff", "action_high_freq_share"} and recorder.flush() == {}
