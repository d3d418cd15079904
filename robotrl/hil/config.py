"""The `hil.*` settings of a training run: demonstrations, the operator who takes over, the mixing of
offline and online data, and a learned reward (see robotrl/hil/ and robotrl/data/mixer.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from robotrl.data.mixer import RatioSchedule
from robotrl.hil.scripted_operator import ScriptedOperatorConfig

OPERATORS = ("none", "scripted", "keyboard", "spacemouse", "gamepad", "joy", "twist")
ROS_OPERATORS = ("joy", "twist")  # devices whose commands come over ROS 2 topics (hardware/teleop/ros_topics.py)


@dataclass
class HILConfig:
    demos: list[str] = field(default_factory=list)  # recorded datasets (robotrl-record) for the offline buffer
    # who takes over: none | scripted (the task's expert) | keyboard | spacemouse | gamepad (devices plugged in
    # here) | joy (a pad through joy_node) | twist (a SpaceMouse through spacenav_node), over ROS 2 topics
    operator: str = "none"
    teleop_topic: str | None = None  # joy and twist: the topic (null: /joy, /spacenav/twist)
    teleop_domain_id: int = 0  # joy and twist: the ROS 2 domain their messages come on
    on_disconnect: str = "resume"  # a teleop device that disconnects: resume (the policy acts) | stop the episode
    teleop_gain: float = 1.0  # scales the device's command before it is clipped to [-1, 1]
    scripted: ScriptedOperatorConfig = field(default_factory=ScriptedOperatorConfig)
    offline_ratio: float = 0.5  # share of each batch drawn from the offline buffer (RLPD: 0.5)
    offline_ratio_final: float | None = None  # if set, the share moves linearly to this value ...
    offline_ratio_steps: int = 0  # ... over this many env steps
    offline_capacity: int = 200_000  # transitions the offline buffer keeps (demonstrations + interventions)
    reward_classifier: str | None = None  # a robotrl-train-classifier output dir: its verdict is reward and success
    # Offline-to-online: this many updates on the demonstrations alone before the first env step; the policy
    # then acts from that step on (no random warm-up), while online updates still wait for learning_starts.
    pretrain_updates: int = 0

    @property
    def mixes_offline(self) -> bool:
        return bool(self.demos) or self.operator != "none"

    def validate(self) -> None:
        if self.operator not in OPERATORS:
            raise ValueError(f"hil.operator must be one of {', '.join(OPERATORS)}, got {self.operator!r}")
        if not 0 <= self.teleop_domain_id <= 232:
            raise ValueError(f"hil.teleop_domain_id must be a ROS 2 domain id in 0..232, got {self.teleop_domain_id}")
        if self.on_disconnect not in ("resume", "stop"):
            raise ValueError(f"hil.on_disconnect must be resume or stop, got {self.on_disconnect!r}")
        if not (self.teleop_gain > 0 and math.isfinite(self.teleop_gain)):
            raise ValueError(f"hil.teleop_gain must be a finite number > 0, got {self.teleop_gain}")
        if self.pretrain_updates < 0:
            raise ValueError(f"hil.pretrain_updates must be >= 0, got {self.pretrain_updates}")
        if self.pretrain_updates and not self.demos:
            raise ValueError(
                f"hil.pretrain_updates={self.pretrain_updates} pretrains on demonstrations, but hil.demos is empty"
            )
        if self.offline_capacity < 1:
            raise ValueError(f"hil.offline_capacity must be >= 1, got {self.offline_capacity}")
        for path in self.demos:
            if not isinstance(path, str) or not path:
                raise ValueError(f"hil.demos entries must be dataset directories, got {path!r}")
        self.scripted.validate()
        RatioSchedule(self.offline_ratio, self.offline_ratio_final, self.offline_ratio_steps)  # validates
