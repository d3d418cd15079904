"""Human in the loop: the online/offline mixer, takeover corrections, behaviour cloning, recording."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from helpers import REPO, run_module
from robotrl.tasks import TASK_CONFIGS, make_env

from robotrl.agents.config import EncoderConfig
from robotrl.agents.sac import SAC, SACConfig
from robotrl.core.env import StepResult
from robotrl.core.spec import TensorSpec
from robotrl.data.dataset import EpisodeDataset
from robotrl.data.frame_replay import FrameReplay
from robotrl.data.mixer import MixedReplay, RatioSchedule, add_episode, stack_frames
from robotrl.data.replay import Batch, ReplayBuffer
from robotrl.hil.config import HILConfig
from robotrl.hil.intervention import InterventionEnv, TeleopOperator
from robotrl.hil.scripted_operator import ScriptedOperator, ScriptedOperatorConfig, expert_of
from robotrl.hil.setup import load_demos, wrap_for_hil
from robotrl.hil.teleop import TeleopCommand, TeleopDevice

SPEC = {"x": TensorSpec((3,))}


def _fill(buffer: ReplayBuffer, steps: int, value: float, episode: int = 10) -> None:
    envs = buffer.num_envs
    for t in range(steps):
        obs = {"x": torch.full((envs, 3), value + t)}
        done = torch.full((envs,), (t + 1) % episode == 0)
        buffer.add(obs, torch.zeros(envs, 2), torch.ones(envs), obs, torch.zeros(envs, dtype=torch.bool), done)


def test_mixer_draws_the_offline_share_and_follows_its_schedule():
    online, offline = ReplayBuffer(SPEC, 2, 1000, num_envs=2), ReplayBuffer(SPEC, 2, 1000)
    mixer = MixedReplay(online, offline, RatioSchedule(0.5, 0.0, 1000))
    _fill(online, 100, 0.0)
    assert mixer.sample(64).demo is None  # offline empty: every row online
    _fill(offline, 50, 1000.0)
    batch = mixer.sample(256)
    assert int(batch.demo.sum()) == 128
    assert (batch.obs["x"][batch.demo] >= 1000).all() and (batch.obs["x"][~batch.demo] < 1000).all()
    mixer.env_step = 500
    assert int(mixer.sample(256).demo.sum()) == 64
    mixer.env_step = 5000
    assert mixer.sample(256).demo is None  # the schedule reached 0: no offline rows


def test_mixer_state_round_trips_with_both_buffers():
    mixer = MixedReplay(ReplayBuffer(SPEC, 2, 100), ReplayBuffer(SPEC, 2, 100))
    _fill(mixer.online, 20, 0.0)
    _fill(mixer.offline, 7, 1000.0)
    restored = MixedReplay(ReplayBuffer(SPEC, 2, 100), ReplayBuffer(SPEC, 2, 100))
    restored.load_state_dict(mixer.state_dict())
    assert len(restored.online) == 20 and len(restored.offline) == 7
    assert torch.equal(restored.offline.obs["x"][:7], mixer.offline.obs["x"][:7])
    with pytest.raises(KeyError, match="offline"):
        restored.load_state_dict(mixer.online.state_dict())


def test_mixer_checkpoint_keeps_an_intervention_run_that_was_open():
    mixer = MixedReplay(ReplayBuffer(SPEC, 2, 100), ReplayBuffer(SPEC, 2, 100))
    for t in range(3):  # an operator is mid-takeover when the checkpoint is taken
        obs = {"x": torch.full((1, 3), float(t))}
        no = torch.zeros(1, dtype=torch.bool)
        mixer.add(obs, torch.zeros(1, 2), torch.ones(1), obs, no, no, intervened=torch.ones(1, dtype=torch.bool))
    assert len(mixer.offline) == 0 and mixer.segments.open_steps == 3
    restored = MixedReplay(ReplayBuffer(SPEC, 2, 100), ReplayBuffer(SPEC, 2, 100))
    restored.load_state_dict(mixer.state_dict())
    # the resumed loop restarts its envs: the run is written, cut (truncated) where the checkpoint was taken
    assert len(restored.offline) == 3 and restored.segments.open_steps == 0
    assert torch.equal(restored.offline.obs["x"][:3, 0, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert restored.offline.truncated[2, 0] and not restored.offline.truncated[:2, 0].any()


def test_an_intervention_that_never_ends_is_written_in_bounded_runs():
    from robotrl.data.mixer import InterventionSegments

    segments, offline = InterventionSegments(1, max_run_steps=4), ReplayBuffer(SPEC, 2, 100)
    no, yes = torch.zeros(1, dtype=torch.bool), torch.ones(1, dtype=torch.bool)
    for t in range(10):  # a takeover flag stuck on, the episode never ending
        obs = {"x": torch.full((1, 3), float(t))}
        segments.add(offline, obs, torch.zeros(1, 2), torch.ones(1), obs, no, no, yes)
    assert len(offline) == 8 and segments.open_steps == 2  # two runs of 4 written, each cut (truncated)
    assert offline.truncated[[3, 7], 0].all() and int(offline.truncated[:8, 0].sum()) == 2
    with pytest.raises(ValueError, match="max_run_steps"):
        InterventionSegments(1, max_run_steps=0)


@pytest.mark.parametrize("batch_size", [1, 3, 5])
def test_mixer_offline_share_is_exact_on_average_for_small_batches(batch_size):
    torch.manual_seed(0)
    mixer = MixedReplay(ReplayBuffer(SPEC, 2, 100), ReplayBuffer(SPEC, 2, 100), RatioSchedule(0.5))
    _fill(mixer.online, 20, 0.0)
    _fill(mixer.offline, 20, 1000.0)
    draws = 4000
    offline = sum(int(mixer.sample(batch_size).obs["x"][:, 0].ge(1000).sum()) for _ in range(draws))
    assert offline / (draws * batch_size) == pytest.approx(0.5, abs=0.03)  # rounding gave 0, 0.67, 0.4


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("offline_ratio", 1.5, "hil.offline_ratio"),
        ("operator", "telepathy", "hil.operator must be one of none, scripted"),
        ("on_disconnect", "panic", "hil.on_disconnect"),
        ("offline_capacity", 0, "hil.offline_capacity"),
    ],
)
def test_hil_config_names_bad_values(key, value, match):
    cfg = HILConfig()
    setattr(cfg, key, value)
    with pytest.raises(ValueError, match=match):
        cfg.validate()


def _pick_env(num_envs: int = 2, **overrides):
    cfg = TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", episode_steps=30, **overrides)
    return make_env(cfg, num_envs=num_envs)


def test_interventions_reach_both_buffers_as_runs_that_end_in_a_truncation():
    env = _pick_env()
    operator = ScriptedOperator(expert_of(env), 2, ScriptedOperatorConfig(patience=2, takeover_steps=4, budget=100))
    env = InterventionEnv(env, operator)
    mixer = MixedReplay(ReplayBuffer(env.obs_spec, 4, 1000, 2), ReplayBuffer(env.obs_spec, 4, 1000))
    obs = env.reset(seed=0)
    intervened_actions = []
    for _ in range(60):  # two full episodes per env: every open run is flushed at the last step
        policy = torch.rand(2, 4) * 2 - 1
        result = env.step(policy)
        assert result.intervened is not None and result.action is not None
        executed = result.action
        assert torch.equal(executed[~result.intervened], policy[~result.intervened])
        intervened_actions += list(executed[result.intervened])
        mixer.add(obs, executed, result.reward, result.next_obs, result.terminated, result.truncated, result.intervened)
        obs = result.obs
    flagged = len(intervened_actions)
    assert flagged > 10
    assert len(mixer.offline) == flagged == mixer.interventions_stored
    assert len(mixer.online) == 120  # every step online, corrections included
    offline_actions = mixer.offline.action[:flagged, 0]
    assert {tuple(a.tolist()) for a in offline_actions} == {tuple(a.tolist()) for a in intervened_actions}
    stats = env.flush_stats()
    assert stats["interventions_per_episode"] == pytest.approx(flagged / 4)
    assert 0 < stats["intervention_rate"] < 1 and "would_intervene_rate" in stats
    # each copied run ends in a truncation, so n-step sums and sequences never join two runs
    ends = mixer.offline.truncated[:flagged, 0] | mixer.offline.terminated[:flagged, 0]
    assert ends[-1] and 1 < int(ends.sum()) < flagged
    batch = mixer.offline.sample_sequences(256, 6)
    for valid in batch.valid:
        assert valid.cumsum(0).tolist() == list(range(1, int(valid.sum()) + 1)) + [int(valid.sum())] * (
            6 - int(valid.sum())
        )


def test_scripted_operator_takes_over_on_drift_and_its_budget_decays():
    expert = torch.zeros(1, 2)
    cfg = ScriptedOperatorConfig(patience=3, stall_steps=0, takeover_steps=5, budget=8, budget_decay=0.5)
    operator = ScriptedOperator(lambda: expert, 1, cfg)
    obs = {"x": torch.zeros(1, 3)}
    far = torch.ones(1, 2)
    engaged = [bool(operator.decide(obs, far)[0]) for _ in range(12)]
    # drifts for 3 steps, then takes over for 5, then drifts again and spends the rest of the budget (3)
    assert engaged == [False, False, True, True, True, True, True, False, False, True, True, True]
    assert not operator.decide(obs, far)[0]  # budget spent
    assert int(operator.takeover_left) == 0  # the cut-short takeover is over: drift is watched (and counted) again
    done = StepResult(
        {},
        {},
        torch.zeros(1),
        torch.zeros(1, dtype=torch.bool),
        torch.ones(1, dtype=torch.bool),
        torch.zeros(1, dtype=torch.bool),
    )
    operator.observe(done)
    assert int(operator.budget_left) == 4  # 8 * 0.5
    close = torch.zeros(1, 2)
    assert not any(bool(operator.decide(obs, close)[0]) for _ in range(10))  # agreeing with the expert
    assert operator.flush_stats()["would_intervene_rate"] > 0


def test_scripted_operator_takes_over_a_stalled_policy_but_never_a_succeeding_one():
    cfg = ScriptedOperatorConfig(drift_threshold=10.0, stall_steps=4, takeover_steps=2, budget=50)
    operator = ScriptedOperator(lambda: torch.zeros(1, 2), 1, cfg)
    obs = {"x": torch.zeros(1, 3), "pixels": torch.zeros(1, 3, 8, 8, dtype=torch.uint8)}
    engaged = [bool(operator.decide(obs, torch.zeros(1, 2))[0]) for _ in range(6)]
    assert engaged == [False, False, False, False, True, True]
    operator.succeeding = torch.ones(1, dtype=torch.bool)
    assert not any(bool(operator.decide(obs, torch.zeros(1, 2))[0]) for _ in range(8))


class ScriptedDevice(TeleopDevice):
    """A device that replays a list of commands (the real interface; the hardware devices have own tests)."""

    name = "replay"

    def __init__(self, commands):
        self.commands = list(commands)

    def poll(self) -> TeleopCommand:
        return self.commands.pop(0) if len(self.commands) > 1 else self.commands[0]


@pytest.mark.parametrize("on_disconnect", ["resume", "stop"])
def test_a_device_that_disconnects_ends_the_takeover(on_disconnect):
    push = TeleopCommand(engaged=True, twist=torch.tensor([1.0, 0, 0, 0, 0, 0]), gripper=1.0)
    gone = TeleopCommand.idle(connected=False)
    env = InterventionEnv(
        _pick_env(1), TeleopOperator(ScriptedDevice([push, push, gone]), 4, on_disconnect=on_disconnect)
    )
    env.reset(seed=0)
    policy = torch.full((1, 4), -0.5)
    for _ in range(2):
        result = env.step(policy)
        assert result.intervened.item() and torch.equal(result.action, torch.tensor([[1.0, 0, 0, 1.0]]))
    result = env.step(policy)  # the device is gone: the policy's action, and never an exception
    assert not result.intervened.item() and torch.equal(result.action, policy)
    assert bool(result.truncated.item()) == (on_disconnect == "stop")
    for _ in range(3):
        assert not env.step(policy).truncated.item()  # only that one episode was stopped


def test_a_teleop_command_moves_the_tool_along_world_axes_under_relative_frame():
    """Under task.relative_frame the tool's start frame is upside down (180 deg about x at home): the
    operator's "up" must still move the tool up."""
    up = TeleopCommand(engaged=True, twist=torch.tensor([0.0, 0, 1.0, 0, 0, 0]), gripper=-1.0)
    cfg = TASK_CONFIGS["panda_pick_cube"](name="panda_pick_cube", relative_frame=True)
    inner = make_env(cfg, num_envs=1)
    env = InterventionEnv(
        inner, TeleopOperator(ScriptedDevice([up]), 4, to_action_frame=inner.task.controller.world_to_action)
    )
    env.reset(seed=0)
    start = inner.task.ee_pos().clone()
    for _ in range(5):
        result = env.step(torch.zeros(1, 4))
    assert result.intervened.item() and result.action[0, 2] < -0.99  # "up" is -z of the tool's frame
    assert inner.task.ee_pos()[0, 2] > start[0, 2] + 0.04
    env.close()


@pytest.mark.parametrize("control", ["joint_position", "joint_delta"])
def test_a_teleop_operator_needs_end_effector_control(control):
    """A device's twist read as joint targets would move joints the operator never moved: refused up front."""
    cfg = TASK_CONFIGS["panda_reach"](name="panda_reach", control=control)
    env = make_env(cfg, num_envs=1)
    try:
        assert env.control == control
        with pytest.raises(ValueError, match=f"hil.operator=keyboard.*{control}.*task.control=ee_delta"):
            wrap_for_hil(env, HILConfig(operator="keyboard"))
    finally:
        env.close()
    ee_env = make_env(TASK_CONFIGS["panda_reach"](name="panda_reach"), num_envs=1)
    assert ee_env.control == "ee_delta"  # the arm tasks' default
    ee_env.close()


def test_bc_term_pulls_the_actor_to_the_demonstrated_actions():
    obs = {"x": torch.randn(64, 3)}
    target = torch.tensor([0.6, -0.4]).expand(64, 2)
    batch = Batch(
        obs, target, torch.zeros(64, 1), torch.full((64, 1), 0.99), obs, demo=torch.ones(64, dtype=torch.bool)
    )

    def distance_after_training(bc_weight: float) -> float:
        torch.manual_seed(0)
        cfg = SACConfig(actor_hidden=[32], critic_hidden=[32], bc_weight=bc_weight, actor_lr=1e-3)
        agent = SAC(cfg, SPEC, 2)
        for _ in range(300):
            metrics = agent.update(batch)
        assert ("bc_loss" in metrics) == (bc_weight > 0)
        return float((agent.act(obs, deterministic=True) - target).pow(2).mean())

    cloned, free = distance_after_training(20.0), distance_after_training(0.0)
    assert cloned < 0.02 and cloned < 0.1 * free


def test_frame_replay_keeps_the_history_of_a_run_that_starts_mid_episode():
    spec = {"pixels": TensorSpec((9, 4, 4), torch.uint8)}
    frames = torch.arange(6, dtype=torch.uint8).view(6, 1, 1, 1).expand(6, 3, 4, 4)
    stacks = stack_frames(frames, 3)  # [6, 9, 4, 4]
    replay = FrameReplay(spec, 1, 100, num_envs=1, frame_stack=3)
    for t in range(2, 5):  # a run copied from steps 2..4 of an episode
        replay.add(
            {"pixels": stacks[t : t + 1]},
            torch.zeros(1, 1),
            torch.zeros(1),
            {"pixels": stacks[t + 1 : t + 2]},
            torch.zeros(1, dtype=torch.bool),
            torch.tensor([t == 4]),
        )
    obs, next_obs = replay._observations(torch.arange(3), torch.zeros(3, dtype=torch.long), torch.arange(3))
    assert torch.equal(obs["pixels"], stacks[2:5]) and torch.equal(next_obs["pixels"], stacks[3:6])


def test_recorded_demos_load_into_the_offline_buffer_stacked_and_only_for_the_reward_they_were_recorded_with(
    tmp_path,
):
    out = tmp_path / "pick"
    run_module(
        "robotrl.record",
        "task=panda_pick_cube",
        "teleop=scripted",
        "episodes=2",
        "task.episode_steps=40",
        "task.obs=state+pixels",
        "task.image_size=64",
        f"out={out}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    )
    dataset = EpisodeDataset.open(out)
    episodes = dataset.load_all()
    assert len(episodes) == 2 and all(e.intervention.all() for e in episodes)
    assert dataset.metadata["task"] == "panda_pick_cube" and dataset.metadata["reward"] == "dense"
    state = {k: s for k, s in dataset.obs_spec.items() if k != "pixels_front"}
    refused = ReplayBuffer(state, 4, 1000)
    with pytest.raises(ValueError, match=r"recorded with task\.reward=dense, this run trains with task\.reward=sparse"):
        load_demos([str(out)], refused, state, 4, task="panda_pick_cube", reward="sparse")
    assert len(refused) == 0
    assert load_demos([str(out)], refused, state, 4, task="panda_pick_cube", reward="dense") == 80
    spec = {k: s for k, s in dataset.obs_spec.items() if k != "pixels_front"}
    spec["pixels_front"] = TensorSpec((9, 64, 64), torch.uint8)
    offline = FrameReplay(spec, 4, 1000, num_envs=1, frame_stack=3)
    add_episode(offline, episodes[0], ["pixels_front"], frame_stack=3)
    assert len(offline) == 40
    obs, _ = offline._observations(torch.tensor([5]), torch.zeros(1, dtype=torch.long), torch.tensor([5]))
    assert torch.equal(obs["pixels_front"][0], stack_frames(episodes[0].obs["pixels_front"], 3)[5])
    assert torch.equal(obs["cube_pos"][0], episodes[0].obs["cube_pos"][5])


def test_a_demo_ends_at_its_first_success_when_the_run_terminates_on_success():
    """A scripted push succeeds, then carries the puck past the goal: with task.terminate_on_success the run's
    online episodes end at success, so its demos must too, or success is followed by failures and the
    overshoot is cloned."""
    from robotrl.data.dataset import Episode

    success = torch.tensor([False, False, False, True, True, False, False, True])
    episode = Episode(
        obs={"x": torch.arange(9.0).unsqueeze(-1)},
        action=torch.zeros(8, 2),
        reward=success.float() - 1.0,
        terminated=torch.zeros(8, dtype=torch.bool),
        truncated=torch.arange(8) == 7,
        success=success,
        intervention=torch.zeros(8, dtype=torch.bool),
    )
    spec = {"x": TensorSpec((1,))}
    cut, whole = ReplayBuffer(spec, 2, 16), ReplayBuffer(spec, 2, 16)
    assert add_episode(cut, episode, end_at_success=True) == 4
    assert cut.reward[:4, 0].tolist() == [-1.0, -1.0, -1.0, 0.0]
    assert cut.terminated[:4, 0].tolist() == [False, False, False, True] and not cut.truncated[:4].any()
    assert torch.equal(cut.next_obs["x"][3, 0], torch.tensor([4.0]))
    assert add_episode(whole, episode) == 8
    assert not whole.terminated[:8].any() and whole.truncated[:8, 0].tolist() == [False] * 7 + [True]
    never = dataclasses.replace(episode, success=torch.zeros(8, dtype=torch.bool))
    assert add_episode(ReplayBuffer(spec, 2, 16), never, end_at_success=True) == 8  # nothing to cut at


@pytest.mark.slow
def test_training_with_demos_and_the_scripted_operator(tmp_path):
    demos = tmp_path / "demos"
    run_module("robotrl.record", "teleop=scripted", "episodes=2", f"out={demos}", f"hydra.run.dir={tmp_path / 'h'}")
    run_dir = tmp_path / "run"
    run_module(
        "robotrl.train",
        "task=panda_pick_cube",
        f"hil.demos=[{demos}]",
        "hil.operator=scripted",
        "agent.bc_weight=1.0",
        "total_steps=400",
        "learning_starts=100",
        "log_interval=200",
        "eval_interval=1000",
        "eval_episodes=1",
        "checkpoint_interval=1000",
        "checkpoint_replay=false",
        "agent.batch_size=32",
        "agent.actor_hidden=[32,32]",
        "agent.critic_hidden=[32,32]",
        "progress=false",
        "video=false",
        f"hydra.run.dir={run_dir}",
    )
    metrics = (run_dir / "metrics.csv").read_text()
    for key in ("hil/intervention_rate", "hil/offline_transitions", "bc_loss", "hil/would_intervene_rate"):
        assert key in metrics
    # resumed from checkpoints without the replay: the demos are loaded again, so BC goes on
    run_module("robotrl.train", f"resume={run_dir}", "total_steps=600", "progress=false")
    bc_steps = [
        int(line.split(",")[0]) for line in (run_dir / "metrics.csv").read_text().splitlines() if ",bc_loss," in line
    ]
    assert max(bc_steps) == 600
    bc_dir = tmp_path / "bc"
    run_module(
        "robotrl.train",
        "task=panda_pick_cube",
        "agent=bc",
        f"hil.demos=[{demos}]",
        "hil.offline_ratio=1.0",
        "learning_starts=0",
        "total_steps=200",
        "eval_interval=1000",
        "eval_episodes=1",
        "log_interval=100",
        "agent.hidden=[32]",
        "progress=false",
        "video=false",
        f"hydra.run.dir={bc_dir}",
    )
    bc_losses = [
        float(line.split(",")[2]) for line in (bc_dir / "metrics.csv").read_text().splitlines() if ",bc_loss," in line
    ]
    assert len(bc_losses) == 2 and bc_losses[1] < bc_losses[0]
    bad = run_module(
        "robotrl.train",
        "task=panda_reach",
        f"hil.demos=[{demos}]",
        "total_steps=10",
        "learning_starts=0",
        f"hydra.run.dir={tmp_path / 'x'}",
        check=False,
    )
    output = bad.stderr + bad.stdout
    assert bad.returncode != 0 and "recorded on task 'panda_pick_cube', this run trains 'panda_reach'" in output


def _push_demos(out, **settings):
    from robotrl.record import RecordConfig, record

    task = TASK_CONFIGS["panda_push"](name="panda_push", reward="sparse", terminate_on_success=True)
    record(RecordConfig(task=task, teleop="scripted", episodes=6, seed=3, keep="success", **settings), out)
    return EpisodeDataset.open(out).load_all()


def _mean_sq_action_change(episodes) -> float:
    return float(torch.cat([e.action.diff(dim=0).pow(2).sum(-1) for e in episodes]).mean())


def test_disturbed_scripted_demos_start_off_course_and_record_only_the_experts_clean_actions(tmp_path):
    """disturb_steps: each demo begins after up to that many unrecorded noisy expert steps, so its first
    state is one the expert's own episodes never start from (arm moving); what is recorded is the expert's
    noise-free recovery, as smooth step to step as undisturbed demos, where noise=1 records its noise."""
    plain = _push_demos(tmp_path / "plain")
    disturbed = _push_demos(tmp_path / "disturbed", disturb_steps=30, disturb_noise=1.0)
    noisy = _push_demos(tmp_path / "noisy", noise=1.0)
    assert all(e.success.any() for e in disturbed) and all(e.intervention.all() for e in disturbed)
    assert all(bool((e.obs["arm_qvel"][0] == 0).all()) for e in plain)  # a reset starts at rest
    moving = [bool((e.obs["arm_qvel"][0].abs() > 0.05).any()) for e in disturbed]
    assert sum(moving) >= 3, moving
    smooth, rough = _mean_sq_action_change(plain), _mean_sq_action_change(noisy)
    assert _mean_sq_action_change(disturbed) < 2 * smooth < rough / 4, (smooth, rough)
    again = _push_demos(tmp_path / "again", disturb_steps=30, disturb_noise=1.0)  # the recorder's seed decides
    assert all(torch.equal(a.action, b.action) for a, b in zip(disturbed, again, strict=True))


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"disturb_steps": -1}, "disturb_steps must be an int >= 0, got -1"),
        ({"disturb_steps": True}, "disturb_steps must be an int >= 0, got True"),
        ({"disturb_noise": float("nan")}, "disturb_noise must be >= 0, got nan"),
        ({"disturb_steps": 5, "teleop": "keyboard"}, "disturb_steps needs teleop=scripted"),
    ],
)
def test_record_refuses_a_bad_disturbance(settings, match):
    from robotrl.record import RecordConfig

    task = TASK_CONFIGS["panda_push"](name="panda_push")
    with pytest.raises(ValueError, match=match):
        RecordConfig(task=task, **{"teleop": "scripted", **settings}).validate()


def test_record_from_a_keyboard_in_a_terminal(tmp_path):
    """robotrl-record teleop=keyboard with a pseudo-terminal as its stdin, as over SSH."""
    out = tmp_path / "kb"
    master, slave = os.openpty()
    env = dict(os.environ, MUJOCO_GL="egl")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "robotrl.record",
            "task=panda_pick_cube",
            "teleop=keyboard",
            "episodes=50",
            "task.episode_steps=10",
            "rate_hz=100",
            f"out={out}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "dataset.json").exists() or len(EpisodeDataset.open(out)) < 2:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "no episode recorded within 120 s"
            os.write(master, b"w ")  # +x and the gripper toggle, as a person holding keys
            time.sleep(0.05)
        os.write(master, b"q")
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(master)
        os.close(slave)
    assert proc.returncode == 0, stderr[-2000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["stopped"] == "the operator quit"
    episodes = EpisodeDataset.open(out).load_all()
    assert len(episodes) >= 2
    actions = torch.cat([e.action for e in episodes])
    assert (actions[:, 0] > 0.5).any()  # the "w" key pushed +x
    assert all(e.intervention.all() for e in episodes)


def _mixed(obs_spec, action_dim, n_step, pixels=False):
    def buffer(envs):
        if pixels:
            return FrameReplay(obs_spec, action_dim, 200, envs, frame_stack=3, n_step=n_step)
        return ReplayBuffer(obs_spec, action_dim, 200, envs, n_step=n_step)

    mixer = MixedReplay(buffer(2), buffer(1))
    for replay in (mixer.online, mixer.offline):
        envs = replay.num_envs
        for t in range(30):
            obs = {k: torch.randint(0, 255, (envs, *s.shape), dtype=s.dtype) for k, s in obs_spec.items()}
            action = torch.rand(envs, action_dim) * 2 - 1
            done = torch.full((envs,), t % 10 == 9)
            replay.add(obs, action, torch.rand(envs), obs, torch.zeros(envs, dtype=torch.bool), done)
    return mixer


def test_chunk_critic_and_drqv2_learn_from_mixed_batches_with_behaviour_cloning():
    from robotrl.agents.chunk import ChunkConfig, ChunkCritic
    from robotrl.agents.drqv2 import DrQv2, DrQv2Config

    chunk = ChunkCritic(ChunkConfig(chunk_len=3, actor_hidden=[16], critic_hidden=[16], bc_weight=1.0), SPEC, 2)
    batch = _mixed(SPEC, 2, n_step=3).sample(16)
    assert int(batch.demo.sum()) == 8 and batch.actions.shape == (16, 3, 2)
    assert torch.isfinite(chunk.update(batch)["bc_loss"])

    pixels = {"pixels": TensorSpec((9, 64, 64), torch.uint8)}
    drq = DrQv2(
        DrQv2Config(hidden=[16], batch_size=8, bc_weight=1.0, encoder=EncoderConfig(conv_layers=2, conv_stride=2)),
        pixels,
        2,
    )
    batch = _mixed(pixels, 2, n_step=3, pixels=True).sample(8)
    assert int(batch.demo.sum()) == 4 and batch.obs["pixels"].shape == (8, 9, 64, 64)
    assert torch.isfinite(drq.update(batch)["bc_loss"])


def test_chunk_cloning_imitates_only_the_recorded_steps_of_a_chunk():
    from robotrl.agents.base import behaviour_cloning_loss
    from robotrl.agents.chunk import ChunkConfig, ChunkCritic

    chunk = ChunkCritic(ChunkConfig(chunk_len=3, actor_hidden=[16], critic_hidden=[16], bc_weight=1.0), SPEC, 2)
    batch = _mixed(SPEC, 2, n_step=3).sample(64)
    assert not batch.valid.all()  # some chunks run past an episode's end, padded with its last action
    entries = chunk.recorded_entries(batch, batch.demo)
    assert entries.shape == (64, 6)
    assert torch.equal(entries, batch.demo[:, None] & batch.valid.repeat_interleave(2, dim=1))
    policy = torch.zeros(64, 6, requires_grad=True)
    behaviour_cloning_loss(policy, chunk.batch_action(batch), entries).backward()
    assert (policy.grad[~entries] == 0).all() and (policy.grad[entries] != 0).any()  # padding pulls nothing


def test_q_filter_clones_only_the_recorded_actions_the_critic_rates_higher():
    agent = SAC(SACConfig(actor_hidden=[16], critic_hidden=[16], bc_weight=1.0, bc_q_filter=True), SPEC, 2)
    features = agent.encoder({"x": torch.randn(256, 3)})
    recorded, own = torch.rand(256, 2) * 2 - 1, torch.rand(256, 2) * 2 - 1
    keep = agent._prefers_recorded(features, recorded, own)
    with torch.no_grad():
        q_recorded = agent.critic(torch.cat([features, recorded], -1)).min(0).values.squeeze(-1)
        q_own = agent.critic(torch.cat([features, own], -1)).min(0).values.squeeze(-1)
    assert torch.equal(keep, q_recorded >= q_own) and 0 < int(keep.sum()) < 256
    assert agent._prefers_recorded(features, own, own).all()
    obs = {"x": torch.randn(32, 3)}
    batch = Batch(
        obs,
        torch.rand(32, 2) * 2 - 1,
        torch.zeros(32, 1),
        torch.ones(32, 1),
        obs,
        demo=torch.ones(32, dtype=torch.bool),
    )
    assert torch.isfinite(agent.update(batch)["bc_loss"])


def test_bc_weight_decays_on_the_update_clock():
    from robotrl.agents.base import bc_weight_at

    assert bc_weight_at(10.0, None, 100, 50) == 10.0
    assert bc_weight_at(10.0, 1.0, 100, 50) == pytest.approx(5.5)
    assert bc_weight_at(10.0, 1.0, 100, 1000) == 1.0 and bc_weight_at(10.0, 2.0, 0, 0) == 2.0
    obs = {"x": torch.randn(16, 3)}
    batch = Batch(
        obs, torch.zeros(16, 2), torch.zeros(16, 1), torch.ones(16, 1), obs, demo=torch.ones(16, dtype=torch.bool)
    )
    cfg = SACConfig(actor_hidden=[16], critic_hidden=[16], bc_weight=5.0, bc_weight_final=0.0, bc_decay_updates=2)
    agent = SAC(cfg, SPEC, 2)
    assert ["bc_loss" in agent.update(batch) for _ in range(3)] == [True, True, False]  # weights 5, 2.5, 0
    with pytest.raises(ValueError, match=r"agent\.bc_weight_final must be a finite number >= 0 or null, got -1"):
        SACConfig(bc_weight=1.0, bc_weight_final=-1.0).validate()
    with pytest.raises(ValueError, match=r"agent\.bc_decay_updates must be >= 0, got -3"):
        SACConfig(bc_decay_updates=-3).validate()
