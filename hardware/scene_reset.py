"""The scene between robot episodes: a person puts the tracked objects back, then the episode's goals are drawn.

`SceneReset.wait` (the arm held at home) waits up to `scene_timeout` until every tracked object with a start
region (the box the simulated task starts it in: push's puck, pick's cube) has a fresh pose inside it and has
stayed still there (within SETTLE_DISTANCE) for `scene_settle`, and refuses by name (`SceneResetError`) when
nobody puts it back; where goals are drawn, every tracked object needs a fresh pose. `draw_goals` then draws the
episode's goals with the task's own sampler (`draw_goals`), around where the objects are, from a generator that
`seed` makes repeatable. Poses come through `pose_of(name) -> (position, problem)`, so nothing here needs DDS.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
from robotrl.hardware.robot_env_config import RobotEnvConfig
from robotrl.hardware.robot_link import ResetTimeoutError
from robotrl.hardware.robot_vec_env import goal_box

from robotrl.core.env import EnvCancelled

log = logging.getLogger(__name__)

SETTLE_DISTANCE = 0.005  # m: an object that moves less than this while it settles is still

GoalSampler = Callable[[dict[str, np.ndarray], torch.Generator], dict[str, np.ndarray]]


class SceneResetError(ResetTimeoutError):
    """reset() found the tracked objects not back in their start regions within scene_timeout (or, with the
    scene not checked, no fresh pose to draw the episode's goals around within reset_timeout)."""


class SceneReset:
    """See the module docstring. `goal` is the env's goal dict: the sampler's first (checked) values and each
    episode's drawn goals are written into it. `request()` asks whatever puts objects back by itself, once per
    wait that finds the scene not ready."""

    def __init__(
        self,
        cfg: RobotEnvConfig,
        tracked_objects: list[str],
        goal: dict[str, np.ndarray],
        pose_of: Callable[[str], tuple[np.ndarray, str | None]],
        start_regions: dict[str, list[list[float]]] | None = None,
        goal_sampler: GoalSampler | None = None,
        request: Callable[[], None] | None = None,
    ):
        self.cfg, self.tracked_objects, self.goal = cfg, list(tracked_objects), goal
        self.pose_of, self.request = pose_of, request
        # objects a person puts back between episodes: name -> (low, high) of its position's first coordinates
        regions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, box in (start_regions or {}).items():
            low, high = regions[name] = goal_box(f"start_regions.{name}", box)
            if not (1 <= low.size <= 3 and np.isfinite(low).all() and np.isfinite(high).all()):
                raise ValueError(f"start_regions.{name} must bound 1 to 3 coordinates with finite corners, got {box}")
        self.start_regions = {name: box for name, box in regions.items() if name in self.tracked_objects}
        self.goal_sampler, self.drawn_goals = goal_sampler, self._check_goal_sampler(goal_sampler, regions)
        self.generator = torch.Generator()
        self.generator.seed()  # not the same goals in every session; seed(...) makes them repeatable

    def _check_goal_sampler(self, sampler: GoalSampler | None, regions: dict) -> list[str]:
        """The goals `sampler` draws (each one a goal of this env, with its shape), tried once with the objects
        at their start regions' centres; those first values stand until reset() draws the episode's."""
        if sampler is None:
            return []
        centres = {name: np.zeros(3, np.float32) for name in [*self.tracked_objects, *regions]}
        for name, (low, high) in regions.items():
            centres[name][: low.size] = (low + high) / 2
        try:
            drawn = sampler(centres, torch.Generator().manual_seed(0))
        except KeyError as error:
            name = error.args[0]
            raise ValueError(f"the goal sampler draws around object {name!r}, which has no start region") from None
        for key, value in drawn.items():
            if key not in self.goal or np.shape(value) != self.goal[key].shape:
                have = self.goal[key].shape if key in self.goal else "no such goal"
                raise ValueError(f"the goal sampler draws {key!r} of shape {np.shape(value)}; the env has {have}")
            self.goal[key] = np.asarray(value, np.float32)  # a plausible value until reset() draws the episode's
        return sorted(drawn)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def wait(self, cancel: threading.Event | None = None) -> dict[str, np.ndarray]:
        """Wait until the objects the episode starts from are ready; their positions.

        With `scene_timeout` > 0, every tracked object with a start region must have a fresh pose inside it
        and stay still there (within SETTLE_DISTANCE) for `scene_settle`: a person resets the scene between
        robot episodes, and this is where a robot env waits for them. Where goals are drawn, every tracked
        object needs a fresh pose (the sampler may draw around any; within `reset_timeout` when the scene is
        not checked). `cancel` (an Event, set by a session's Ctrl-C: `reset(options={"cancel": event})`) ends
        the wait with EnvCancelled."""
        cfg, period = self.cfg, 1.0 / self.cfg.policy_rate_hz
        regions = self.start_regions if cfg.scene_timeout > 0 else {}
        drawn_around = [n for n in self.tracked_objects if n not in regions] if self.goal_sampler else []
        needed = [*regions, *drawn_around]
        setting, timeout = ("scene_timeout", cfg.scene_timeout) if regions else ("reset_timeout", cfg.reset_timeout)
        deadline = time.monotonic() + timeout
        still_since: dict[str, tuple[np.ndarray, float]] = {}  # object -> (where it came to rest, since when)
        told = False
        while True:
            now, missing, settling, positions = time.monotonic(), [], [], {}
            for name in needed:
                position, problem = self.pose_of(name)
                if problem is None and name in regions:
                    low, high = regions[name]
                    at = position[: low.size]
                    if not ((at >= low) & (at <= high)).all():
                        box = f"{np.round(low.astype(float), 3).tolist()}..{np.round(high.astype(float), 3).tolist()}"
                        problem = f"at {np.round(at.astype(float), 3).tolist()}, not in its start region {box}"
                if problem is not None:
                    still_since.pop(name, None)
                    missing.append(f"{name} {problem}")
                    continue
                if name in regions:
                    rest = still_since.get(name)
                    if rest is None or np.linalg.norm(position - rest[0]) > SETTLE_DISTANCE:
                        rest = still_since[name] = (position, now)
                    if now - rest[1] < cfg.scene_settle:
                        settling.append(f"{name} placed but not yet still for {cfg.scene_settle} s")
                positions[name] = position
            if not missing and not settling:
                return positions
            if cancel is not None and cancel.is_set():
                raise EnvCancelled("reset cancelled while waiting for the scene: " + "; ".join(missing + settling))
            if now > deadline:
                raise SceneResetError(
                    f"the scene was not ready within hardware.{setting} {timeout} s: "
                    + "; ".join(missing + settling)
                    + (" (put each object back where the simulated task starts it)" if regions else "")
                )
            if missing and not told:  # not for an object that is back and settling: that is every reset
                told = True
                log.warning("robot env reset: waiting up to %.1f s for the scene: %s", timeout, missing)
                if self.request is not None and regions:
                    self.request()
            time.sleep(period)

    def draw_goals(self, positions: dict[str, np.ndarray]) -> None:
        """This episode's goals, drawn as the simulated task draws them, around where the objects are."""
        drawn = self.goal_sampler(positions, self.generator)
        for key in self.drawn_goals:
            value = np.asarray(drawn[key], np.float32)
            if not np.isfinite(value).all():
                raise ValueError(f"the task's goal sampler drew a non-finite {key!r}: {value.tolist()}")
            self.goal[key] = value
        goals = {key: np.round(self.goal[key], 3).tolist() for key in self.drawn_goals}
        log.info("robot env reset: this episode's goals %s", goals)
