"""The update schedule's arithmetic (agents/schedule.py) for one env and many, per transition and per vectorized
step, and the schedules it refuses, named."""

from __future__ import annotations

import pytest

from robotrl.agents import SACConfig
from robotrl.agents.schedule import UpdateSchedule


def test_per_transition_counts_every_envs_step():
    one = UpdateSchedule(learning_starts=10, num_envs=1, utd_ratio=2)
    assert [one.due(s) for s in (0, 10, 11, 12, 20)] == [0, 0, 2, 4, 20]
    grouped = UpdateSchedule(learning_starts=0, num_envs=1, utd_ratio=1, update_every=3)
    assert [grouped.due(s) for s in (1, 2, 3, 5, 6, 9)] == [0, 0, 1, 1, 2, 3]
    many = UpdateSchedule(learning_starts=8192, num_envs=4096)  # the default's meaning, kept: updates per env step
    assert many.due(8192 + 4096) == 4096 and many.updates_per_vectorized_step == 4096


def test_per_vectorized_step_whole_and_fractional():
    two = UpdateSchedule(learning_starts=0, num_envs=4096, updates_per_step=2)
    assert [two.due(4096 * k) for k in (1, 2, 10)] == [2, 4, 20] and two.updates_per_vectorized_step == 2
    quarter = UpdateSchedule(learning_starts=0, num_envs=8, updates_per_step=0.25)  # one update every 4 steps
    assert [quarter.due(8 * k) for k in range(1, 10)] == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    third = UpdateSchedule(learning_starts=0, num_envs=1, updates_per_step=1 / 3)  # float products round right
    assert [third.due(k) for k in (2, 3, 6, 300)] == [0, 1, 2, 100]
    late = UpdateSchedule(learning_starts=202, num_envs=4, updates_per_step=0.5)  # start inside a vector
    assert late.due(204) == 0 and late.due(210) == 1 and late.due(400) == 24


@pytest.mark.parametrize(
    "schedule",
    [
        UpdateSchedule(learning_starts=0, num_envs=1, utd_ratio=3, update_every=2),
        UpdateSchedule(learning_starts=0, num_envs=16, updates_per_step=0.25),
        UpdateSchedule(learning_starts=0, num_envs=6, updates_per_step=1.5),
    ],
)
def test_env_steps_for_inverts_due(schedule):
    for updates in range(1, 40):
        steps = schedule.env_steps_for(updates)
        assert schedule.due(steps) >= updates
        assert schedule.due(steps - 1) < updates  # the fewest env steps that owe them
    assert schedule.env_steps_for(0) == 0 and schedule.env_steps_for(-3) == 0


def test_bad_schedules_are_refused_naming_the_settings():
    with pytest.raises(ValueError, match=r"agent.updates_per_step must be a finite number > 0 or null, got 0"):
        SACConfig(updates_per_step=0).validate()
    with pytest.raises(ValueError, match=r"agent.updates_per_step must be a finite number > 0 or null, got nan"):
        SACConfig(updates_per_step=float("nan")).validate()
    with pytest.raises(ValueError, match=r"updates_per_step=2 replaces agent.utd_ratio and agent.update_every \(got 2"):
        SACConfig(updates_per_step=2, utd_ratio=2).validate()
    with pytest.raises(ValueError, match=r"makes no update between learning_starts=100 and total_steps=150"):
        UpdateSchedule(learning_starts=100, num_envs=1, update_every=100).check(150)
    with pytest.raises(ValueError, match=r"updates_per_step=0.01 per vectorized step of num_envs=64\) makes no upd"):
        UpdateSchedule(learning_starts=0, num_envs=64, updates_per_step=0.01).check(64 * 50)
    with pytest.raises(ValueError, match="makes 8192 updates in one vectorized step, more than the 4096 transitions"):
        UpdateSchedule(learning_starts=1000, num_envs=4096, utd_ratio=2).check(10**6)
    UpdateSchedule(learning_starts=1000, num_envs=4096, updates_per_step=2).check(10**6)  # what it suggests
    UpdateSchedule(learning_starts=0, num_envs=1, utd_ratio=4).check(100)  # one env: demos may feed it


def test_a_learner_refuses_a_per_vectorized_step_schedule():
    """A learner's env steps arrive from actors in batches of any size: it counts transitions only."""
    from robotrl.runtime.learner_config import LearnerConfig

    with pytest.raises(ValueError, match=r"agent.updates_per_step=2 counts vectorized steps of one process's envs"):
        LearnerConfig(agent=SACConfig(updates_per_step=2), task=None).validate()
