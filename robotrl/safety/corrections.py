"""Counting the shield's corrections per kind: this step's (for `info`), the running totals, and a
rate-limited log line per kind so a controller at 1 kHz cannot flood the log."""

from __future__ import annotations

import logging

logger = logging.getLogger("robotrl.safety")

CORRECTION_KINDS = (
    "nan",  # a non-finite command: the last safe target is kept
    "position_limit",  # a target beyond the joint limits (minus the margin) was clamped
    "velocity",  # the output's speed, acceleration or jerk was at its limit (the command was smoothed)
    "acceleration",
    "jerk",
    "delta_clip",  # the output's change in one control period was clipped
    "workspace",  # the step would have left the end-effector box and was pulled back
    "workspace_guard",  # the setpoint itself would have left the box: the last one was held (never expected)
    "stale_hold",  # joint state older than hold_after: holding
    "stale_stop",  # joint state older than stop_after (or stamped in the future): stopped until reset()
    "estop",  # the e-stop is latched: holding until reset()
    "command_timeout",  # no policy command for command_timeout: holding
    "gripper_nan",
    "gripper_limit",
    "gripper_rate",  # a gripper command within gripper_min_interval of the last change: it waits
    "state_out_of_order",  # a joint state stamped before the newest one: refused
    "state_glitch",  # a joint state that moved further than the hardware can: refused
    "tracking_error",  # a measured joint lagged its setpoint by more than tracking_error: re-seeded from it
    "motion_error",  # the trajectory generator failed; the setpoint was held
)


class CorrectionCounter:
    def __init__(self, log_interval: float):
        self.log_interval = log_interval
        self.totals = dict.fromkeys(CORRECTION_KINDS, 0)
        self._since_log = dict.fromkeys(CORRECTION_KINDS, 0)
        self._last_log = dict.fromkeys(CORRECTION_KINDS, float("-inf"))
        self.step = dict.fromkeys(CORRECTION_KINDS, 0)

    def begin_step(self) -> None:
        self.step = dict.fromkeys(CORRECTION_KINDS, 0)

    def add(self, kind: str, now: float, detail: str = "") -> None:
        if self.step[kind]:
            return
        self.step[kind] = 1
        self.totals[kind] += 1
        self._since_log[kind] += 1
        if now - self._last_log[kind] >= self.log_interval:
            logger.warning(
                "safety shield: %s x%d since last report (total %d)%s",
                kind,
                self._since_log[kind],
                self.totals[kind],
                f": {detail}" if detail else "",
            )
            self._last_log[kind] = now
            self._since_log[kind] = 0
