"""Takeover on a robot, end to end: robotrl-actor with hil.operator=joy acts on the simulated twin (real MuJoCo in a
thread, real DDS on loopback) through the robot env and the shield and streams to a robotrl-learner process over
real gRPC, while a person's pad, published as joy_node publishes it, takes the arm over and hands it back. Domain
ids 170 (the twin and the robot env) and 175 (the pad's sensor_msgs/Joy: the operator's own domain)."""

import threading
import time

import pytest
import torch
from helpers import (
    LearnerProcess,
    TwinThread,
    free_port,
    join_actor,
    quick_link,
    small_learner_args,
    start_actor,
    wait_for,
)

pytest.importorskip("cyclonedds", reason='needs the ros extra: pip install "robotrl[ros]"')

from hydra import compose, initialize_config_module
from robotrl.hardware.robot_env import RobotEnvConfig
from robotrl.hardware.robot_vec_env import ActorRobotConfig
from robotrl.hardware.ros2.bridge import make_bridge
from robotrl.hardware.ros2.msgs import Joy
from robotrl.tasks.configs import ArmTaskConfig

from robotrl.actor import ActorConfig, ActorHILConfig
from robotrl.learner import Learner
from robotrl.runtime.learner_config import to_learner_config

pytestmark = pytest.mark.dds  # on DDS: runs alone after the parallel tests (tests/conftest.py)

ROBOT_DOMAIN, PAD_DOMAIN = 170, 175
RATE = 250.0
REACH = ArmTaskConfig(name="panda_reach")  # acts in the robot's base axes (no relative_frame): a pad's as they are
EPISODE_STEPS = 50  # panda_reach's
TOTAL_STEPS = 90
LEARNER_ARGS = [*small_learner_args("panda_reach"), "hil.offline_capacity=1000"]

# joy_node's Xbox layout: sticks left/up positive, triggers 1 released .. -1 pressed; B is button 1
REST = [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
RELEASED = [0] * 11
B_HELD = [0, 1, *[0] * 9]
# the left stick pushed left (+y) and a little down (-x); past the pad's 0.1 deadzone each axis ramps from 0, so
# (|v| - 0.1) / 0.9: a motion of 0.3 along +y and 0.1 along -x of max_ee_step, in the robot's base axes
STICK = [0.37, -0.19, 1.0, 0.0, 0.0, 1.0]
STICK_ACTION = torch.tensor([-0.1, 0.3, 0.0])
JOY_PERIOD = 0.05  # joy_node repeats the held state at 20 Hz (autorepeat_rate)
# steps a message may take to reach the actor's next poll after it is published (one step is 40 ms)
DELIVERY_STEPS = 3


def hardware(domain_id: int) -> RobotEnvConfig:
    cfg = RobotEnvConfig(domain_id=domain_id, control_rate_hz=RATE, connect_timeout=10.0, reset_timeout=15.0)
    cfg.shield = {"workspace_min": [0.1, -0.6, 0.05], "workspace_max": [0.8, 0.6, 0.9]}
    return cfg


class PersonAtThePad(threading.Thread):
    """A person watching the arm, with a pad whose messages go out as joy_node's: at rest while the policy takes
    its first `policy_steps` steps, then B (a persistent takeover) and the left stick held until the step that ends
    the episode (`last_step`) is under way, then, while the arm goes home, the stick let go (the takeover holds)
    and B again (the takeover ends), and at rest until stopped. The actor's step count is read before each press
    and after each release, so the takeover's steps lie between them."""

    def __init__(self, pad, actor, policy_steps: int, last_step: int):
        super().__init__(daemon=True)
        self.pad, self.actor = pad, actor
        self.policy_steps, self.last_step = policy_steps, last_step
        self.stop = threading.Event()
        self.pressed_at: int | None = None  # the actor's env_step before B was first pressed
        self.stick_from: int | None = None  # ... when the stick was first pushed
        self.stick_until: int | None = None  # ... after it was let go
        self.released_at: int | None = None  # ... after B was released the second time
        self.error: BaseException | None = None

    def publish_until(self, axes, buttons, done) -> None:
        while not self.stop.is_set() and not done():
            self.pad.publish(Joy(axes=[float(a) for a in axes], buttons=list(buttons)))
            time.sleep(JOY_PERIOD)

    def publish_for(self, axes, buttons, seconds: float) -> None:
        until = time.monotonic() + seconds
        self.publish_until(axes, buttons, lambda: time.monotonic() >= until)

    def run(self) -> None:
        try:
            self.publish_until(REST, RELEASED, lambda: self.actor.env_step >= self.policy_steps)
            self.pressed_at = self.actor.env_step
            self.publish_for(REST, B_HELD, 0.15)
            self.stick_from = self.actor.env_step
            self.publish_until(STICK, RELEASED, lambda: self.actor.env_step >= self.last_step)
            self.publish_for(REST, RELEASED, 0.15)
            self.stick_until = self.actor.env_step
            self.publish_for(REST, B_HELD, 0.15)
            self.pad.publish(Joy(axes=REST, buttons=RELEASED))
            self.released_at = self.actor.env_step
            self.publish_until(REST, RELEASED, lambda: False)
        except BaseException as error:  # surfaced by the test
            self.error = error


def test_a_person_takes_over_the_arm_with_a_pad_and_the_learner_keeps_the_takeover_offline(tmp_path):
    """The person's takeover, made with a pad's B button and left stick on the pad's own ROS domain, is what the
    learner's offline buffer holds: exactly the steps from the first press of B to the second, in order, each with
    the action the stick commanded (or none, while B was held or the stick let go), every one also in the actor's
    stream flagged as intervened, and the arm moved the stick's way; the policy's steps before and after are not
    flagged and none went offline. The second press comes as the arm returns home at the episode's end, while the
    actor does not poll the pad (it polls again after the reset): it still ends the takeover."""
    port, run_dir = free_port(), tmp_path / "learner"
    learner = LearnerProcess(run_dir, port, base=LEARNER_ARGS)
    try:
        with TwinThread(ROBOT_DOMAIN), make_bridge("dds", domain_id=PAD_DOMAIN) as person_side:
            pad = person_side.publisher("/joy", Joy, "sensor_data")
            link = quick_link(port)
            cfg = ActorConfig(
                task=REACH,
                learner=link,
                actor_id="arm",
                total_steps=TOTAL_STEPS,
                batch_steps=10,
                connect_timeout_s=60.0,
                hardware=hardware(ROBOT_DOMAIN),
                robot=ActorRobotConfig(goal_range={"target": [[0.4, -0.1, 0.2], [0.5, 0.1, 0.3]]}),
                hil=ActorHILConfig(operator="joy", teleop_domain_id=PAD_DOMAIN),
            )
            actor, stop, thread, result = start_actor(cfg, run_dir=tmp_path / "actor")
            person = PersonAtThePad(pad, actor, policy_steps=20, last_step=EPISODE_STEPS - 1)
            person.start()
            try:
                summary = join_actor(thread, result, timeout=120)
            finally:
                stop.set()
                person.stop.set()
                person.join(timeout=5)
        assert person.error is None, person.error
        assert person.released_at is not None, "the person never handed the arm back"
        assert summary["env_steps"] == summary["acked_env_steps"] == TOTAL_STEPS
        assert summary["dropped_env_steps"] == 0 and summary["interventions"] > 0

        def runs_closed():
            status = learner.status()
            return status if status["offline"] and status["offline"]["open_run_steps"] == 0 else None

        live = wait_for(runs_closed, 10, "the learner to write the takeover to its offline buffer")
        assert live["streams"]["arm"]["transitions"] == TOTAL_STEPS
        assert live["streams"]["arm"]["interventions"] == summary["interventions"]
        assert live["offline"] == {
            "stored": summary["interventions"],
            "demos": 0,
            "interventions": summary["interventions"],
            "open_run_steps": 0,
        }
    finally:
        assert learner.stop() == 0, learner.output()  # a last checkpoint: the buffers as the learner kept them

    # the learner's buffers, as a restart in its run directory reads them back
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        learner_cfg = to_learner_config(compose("learner", [*LEARNER_ARGS, "device=cpu"]))
    restored = Learner(learner_cfg, run_dir)
    restored.wal.close()
    stream, offline = restored.storage.streams["arm"], restored.storage.offline
    assert stream.rows == TOTAL_STEPS
    flags = stream.intervened[:TOTAL_STEPS, 0]
    intervened = flags.nonzero().flatten()
    assert len(intervened) == summary["interventions"]
    # one takeover, from the first press of B to the second, unbroken while the stick moved, rested and the arm
    # went home; before and after it the policy's steps are not flagged
    first, last = int(intervened[0]), int(intervened[-1])
    assert intervened.tolist() == list(range(first, last + 1))
    assert person.pressed_at <= first <= person.pressed_at + DELIVERY_STEPS, (person.pressed_at, first)
    assert abs(last - person.released_at) <= DELIVERY_STEPS, (person.released_at, last)

    # each intervened action is the stick's command, or no motion while B was held or the stick let go
    actions = stream.buffer.action[:TOTAL_STEPS, 0]
    taken_over = actions[intervened]
    pushed = (taken_over - STICK_ACTION).abs().amax(-1) < 1e-6
    still = taken_over.abs().amax(-1) == 0
    assert bool((pushed | still).all()), taken_over[~(pushed | still)]
    stick_steps = intervened[pushed].tolist()
    assert stick_steps == list(range(stick_steps[0], stick_steps[-1] + 1))  # held without a break
    assert person.stick_from <= stick_steps[0] <= person.stick_from + DELIVERY_STEPS, (person.stick_from, stick_steps)
    assert stick_steps[-1] <= person.stick_until + DELIVERY_STEPS, (person.stick_until, stick_steps)
    assert len(stick_steps) >= person.stick_until - person.stick_from - 2 * DELIVERY_STEPS
    policy_actions = actions[~flags]
    assert not bool(((policy_actions - STICK_ACTION).abs().amax(-1) < 1e-6).any())

    # the offline buffer holds exactly those steps, in order, as one run that ends
    assert len(offline) == len(intervened)
    torch.testing.assert_close(offline.action[: len(offline), 0], taken_over, rtol=0, atol=0)
    for key in offline.obs:
        torch.testing.assert_close(offline.obs[key][: len(offline), 0], stream.buffer.obs[key][intervened, 0])
    assert bool(offline.truncated[len(offline) - 1, 0] | offline.terminated[len(offline) - 1, 0])
    # and the arm went the stick's way while it was pushed (the shield and the arm's lag shorten the distance)
    ee_moved = offline.next_obs["ee_pos"][: len(offline), 0] - offline.obs["ee_pos"][: len(offline), 0]
    displacement = ee_moved[pushed].sum(0)
    direction = torch.nn.functional.cosine_similarity(displacement, STICK_ACTION, dim=0)
    assert float(displacement.norm()) > 0.04 and float(direction) > 0.95, displacement
