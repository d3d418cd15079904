"""Hindsight goal relabelling: goals from later in the same episode, rewards and terminations recomputed
for them, the tasks' goal specs agreeing with the tasks, and the settings it refuses."""

import pytest
import torch
from robotrl.tasks import TASK_CONFIGS, make_env, make_task
from robotrl.tasks.arm_task import TaskVecEnv

from robotrl.config import TrainConfig
from robotrl.data import ReplayBuffer, TensorSpec
from robotrl.data.hindsight import GoalSpec, Hindsight
from robotrl.runtime.assembly import make_hindsight, make_training_env

SPEC = {"pos": TensorSpec((1,)), "goal": TensorSpec((1,)), "to_goal": TensorSpec((1,))}
GAMMA = 0.9


def _outcome(obs, goal):
    success = (obs["pos"] - goal).abs().squeeze(-1) < 0.5
    return success.float() - 1.0, success


LINE = GoalSpec(  # a point on a line: positions are integers, so only the exact position succeeds
    achieved=lambda obs: obs["pos"],
    with_goal=lambda obs, goal: {**obs, "goal": goal, "to_goal": goal - obs["pos"]},
    success=lambda obs, goal: _outcome(obs, goal)[1],
    reward=lambda obs, goal: _outcome(obs, goal)[0],
)


def _fill(buf, episodes):
    """Episodes of (length, how it ends); step t of episode e starts at position 100 e + t and reaches
    100 e + t + 1. Goals are never reached: the stored rewards are all -1 (-2 marks the stored ones)."""
    for e, (length, end) in enumerate(episodes):
        goal = torch.tensor([[-1000.0]])
        for t in range(length):
            pos = torch.tensor([[100.0 * e + t]])
            last = t == length - 1
            buf.add(
                {"pos": pos, "goal": goal, "to_goal": goal - pos},
                torch.zeros(1, 1),
                torch.tensor([-2.0]),
                {"pos": pos + 1, "goal": goal, "to_goal": goal - pos - 1},
                torch.tensor([last and end == "terminated"]),
                torch.tensor([last and end == "truncated"]),
            )


def _buffer(n_step, ratio=1.0, terminal_success=True, capacity=1000, window=50):
    buf = ReplayBuffer(SPEC, 1, capacity=capacity, n_step=n_step, gamma=GAMMA)
    buf.hindsight = Hindsight(LINE, ratio, window, terminal_success)
    return buf


EPISODES = [(6, "truncated"), (4, "terminated"), (7, "truncated"), (3, "terminated"), (5, "truncated")]


def _episode_end(e):
    """The position episode e's last step reaches."""
    return 100.0 * e + EPISODES[e][0]


@pytest.mark.parametrize("capacity", [1000, 18])  # 18: the ring wrapped inside an episode, the oldest are gone
def test_relabelled_goals_come_from_the_start_or_later_in_the_same_episode(capacity):
    buf = _buffer(n_step=3, capacity=capacity)
    _fill(buf, EPISODES)
    batch = buf.sample(4000)
    start, goal = batch.obs["pos"][:, 0], batch.obs["goal"][:, 0]
    episode = torch.div(start, 100, rounding_mode="floor")
    ends = torch.tensor([_episode_end(int(e)) for e in episode])
    assert (goal > start).all() and (goal <= ends).all()  # reached by the start's own step or a later one
    assert torch.equal(torch.div(goal - 1, 100, rounding_mode="floor"), episode)  # never another episode's
    assert torch.equal(batch.obs["to_goal"][:, 0], goal - start)  # derived entries follow the goal
    assert torch.equal(batch.next_obs["goal"][:, 0], goal)
    # every later step of an episode is drawn as a goal, the next one included
    assert set((goal - start).long().tolist()) == set(range(1, max(length for length, _ in EPISODES) + 1))


@pytest.mark.parametrize("terminal_success", [True, False])
def test_relabelled_sequences_are_rewarded_and_end_for_their_goal(terminal_success):
    length = 4
    buf = _buffer(n_step=length, terminal_success=terminal_success)
    _fill(buf, EPISODES)
    batch = buf.sample(4000)
    for i in range(len(batch.reward)):
        start, goal = float(batch.obs["pos"][i, 0]), float(batch.obs["goal"][i, 0])
        e = int(start // 100)
        to_end = int(_episode_end(e) - start)  # steps left in the stored episode
        hit = int(goal - start) - 1  # the step whose next observation is at the goal
        stored_end = EPISODES[e][1] == "terminated"
        if terminal_success:
            count = min(hit + 1, length)
            terminated = hit < length
        else:
            count = min(to_end, length)
            terminated = stored_end and to_end <= length  # a stored termination ends it for any goal
        rewards = [0.0 if k == hit else -1.0 for k in range(count)]
        assert batch.valid[i].sum() == count, (start, goal)
        assert batch.rewards[i, :count].tolist() == rewards and not batch.rewards[i, count:].any()
        assert batch.reward[i, 0] == pytest.approx(sum(r * GAMMA**k for k, r in enumerate(rewards)))
        assert batch.discount[i, 0] == pytest.approx(0.0 if terminated else GAMMA**count)
        assert bool(batch.cut[i]) == (count < length and not terminated)
        assert batch.next_obs["pos"][i, 0] == start + count and batch.next_obs["goal"][i, 0] == goal


def test_a_ratio_of_zero_leaves_every_sequence_as_stored():
    plain = ReplayBuffer(SPEC, 1, capacity=1000, n_step=4, gamma=GAMMA)
    relabelling = _buffer(n_step=4, ratio=0.0)
    for buf in (plain, relabelling):
        _fill(buf, EPISODES)
    row = torch.arange(plain.rows_filled)
    env = torch.zeros_like(row)
    a, b = plain.sequences_at(row, env, 4), relabelling.sequences_at(row, env, 4)
    for name in ("action", "reward", "discount", "actions", "rewards", "valid", "cut"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for key in SPEC:
        assert torch.equal(a.obs[key], b.obs[key]) and torch.equal(a.next_obs[key], b.next_obs[key])


def test_about_ratio_of_the_rows_are_relabelled():
    buf = _buffer(n_step=1, ratio=0.8)
    _fill(buf, EPISODES)
    batch = buf.sample(20_000)
    share = (batch.obs["goal"][:, 0] != -1000.0).float().mean().item()
    assert share == pytest.approx(0.8, abs=0.015)


def test_bad_ratio_or_window_is_refused():
    with pytest.raises(ValueError, match="her_ratio must be in"):
        Hindsight(LINE, 1.5, 10, True)
    with pytest.raises(ValueError, match="her_ratio must be in"):
        Hindsight(LINE, float("nan"), 10, True)
    with pytest.raises(ValueError, match="window"):
        Hindsight(LINE, 0.5, 0, True)


@pytest.mark.parametrize(("name", "goal_key"), [("panda_push", "goal"), ("panda_reach", "target")])
@pytest.mark.parametrize("reward", ["sparse", "dense"])
def test_goal_specs_agree_with_their_tasks(name, goal_key, reward):
    """The spec's reward and success at a stored state equal the task's, with its own goal and with
    another one set in the task; its observation under another goal is what the task observes then."""
    env = TaskVecEnv(make_task(TASK_CONFIGS[name](name=name, reward=reward), 4))
    task = env.task
    spec = task.goal_spec()
    env.reset(seed=0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        noise = 0.3 * torch.randn(4, env.action_dim, generator=generator)
        result = env.step((task.expert_action() + noise).clamp(-1, 1))
        obs = result.next_obs
        own = obs[goal_key]
        assert torch.allclose(spec.reward(obs, own), result.reward)
        assert torch.equal(spec.success(obs, own), result.success)
        assert all(torch.equal(value, obs[key]) for key, value in spec.with_goal(obs, own).items())
        other = spec.achieved(obs)[torch.tensor([1, 2, 3, 0])]  # where another env's object or tool is
        relabelled = spec.with_goal(obs, other)
        getattr(task, goal_key)[:] = other  # the task asked for that goal all along
        reward, success, _ = task.evaluate()
        assert torch.allclose(spec.reward(obs, other), reward) and torch.equal(spec.success(obs, other), success)
        observed = task.observe()
        for key in obs:
            assert torch.allclose(relabelled[key], observed[key], atol=1e-6), key


def _train_config(task: str, **task_kw) -> TrainConfig:
    from robotrl.agents import AGENT_CONFIGS

    return TrainConfig(agent=AGENT_CONFIGS["sac"](), task=TASK_CONFIGS[task](name=task, **task_kw), her_ratio=0.8)


def test_relabelling_is_refused_where_a_reward_could_not_be_recomputed(tmp_path):
    cfg = _train_config("panda_pick_cube")
    env = make_env(cfg.task, 1)
    with pytest.raises(ValueError, match=r"her_ratio=0\.8: task 'panda_pick_cube' has no goal to relabel"):
        make_hindsight(cfg, env)
    cfg = _train_config("panda_reach", obs="pixels")
    env = make_training_env(cfg, 1)
    with pytest.raises(ValueError, match=r"her_ratio=0\.8: hindsight relabelling needs state observations"):
        make_hindsight(cfg, env)
    cfg = _train_config("panda_reach")
    cfg.hil.reward_classifier = str(tmp_path / "classifier")
    with pytest.raises(ValueError, match=r"her_ratio=0\.8: a learned reward"):
        make_hindsight(cfg, make_env(cfg.task, 1))
    cfg = _train_config("panda_reach")
    cfg.her_ratio = -0.1
    with pytest.raises(ValueError, match="her_ratio must be in"):
        cfg.validate()


def test_a_run_relabels_its_online_and_offline_buffers():
    from robotrl.runtime.assembly import make_replay

    cfg = _train_config("panda_push", reward="sparse", terminate_on_success=True)
    cfg.hil.demos = ["unused: the replay is only built"]
    env = make_env(cfg.task, 1)
    replay = make_replay(cfg, env, 3, torch.device("cpu"))
    for buf in (replay.online, replay.offline):
        assert buf.hindsight is not None and buf.hindsight.ratio == 0.8
        assert buf.hindsight.window == 100 and buf.hindsight.terminal_success
    cfg.her_ratio = 0.0
    assert make_replay(cfg, env, 3, torch.device("cpu")).online.hindsight is None


def _learner(run_dir, *overrides):
    from hydra import compose, initialize_config_module

    from robotrl.learner import Learner, to_learner_config

    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = to_learner_config(compose("learner", ["device=cpu", "replay_capacity=1000", *overrides]))
    return Learner(cfg, run_dir)


def test_a_learner_relabels_what_its_actors_stream_and_its_offline_buffer(tmp_path):
    """robotrl-learner her_ratio=1 on panda_reach: every transition it samples from an actor's stream (real env
    steps taken by the actor's stepper, sent as the actor batches them) asks for a position the tool point
    reached at or after that step in the same episode, with the reward, success and termination recomputed; the
    steps an operator took over, copied to the offline buffer, are relabelled there alike."""
    from robotrl.actor import EnvStepper, TransitionBatcher

    args = ("task=panda_reach", "task.reward=sparse", "task.terminate_on_success=true", "task.episode_steps=20")
    learner = _learner(tmp_path / "run", *args, "her_ratio=1.0")
    learner.wal.close()
    env = make_env(learner.cfg.task, num_envs=2)
    stepper, batcher = EnvStepper(env, learner.agent, seed=3), TransitionBatcher(10)
    for t in range(60):
        transition, _ = stepper.step(random_action=True)
        transition["intervened"] = torch.tensor([False, 25 <= t < 45])  # env 1: an operator's 20 steps
        if batcher.add(transition):
            learner.storage.add("arm-1", batcher.pop())
    env.close()
    buffer = learner.storage.streams["arm-1"].buffer
    hindsight = buffer.hindsight
    assert hindsight is learner.storage.ensure_offline().hindsight and hindsight.ratio == 1.0
    assert hindsight.window == 20 and hindsight.terminal_success

    stored_success = hindsight.spec.success(buffer.next_obs, buffer.obs["target"])[:60]
    batch = learner.storage.sample(512)
    goal, obs, next_obs = batch.obs["target"], batch.obs, batch.next_obs
    assert torch.equal(goal, next_obs["target"]) and torch.allclose(obs["to_target"], goal - obs["ee_pos"])
    reached = buffer.next_obs["ee_pos"][:60]  # [rows, envs, 3]
    for i in range(len(goal)):
        start = (buffer.obs["ee_pos"][:60] == obs["ee_pos"][i]).all(-1).nonzero()
        assert len(start) == 1, "each sampled step is one stored step"
        row, column = start[0].tolist()
        at_goal = (reached[:, column] == goal[i]).all(-1).nonzero().flatten().tolist()
        assert at_goal and min(at_goal) >= row, "the goal is where the tool point got at or after the step"
        episode_ends = (buffer.terminated | buffer.truncated)[row : min(at_goal), column]
        assert not episode_ends.any(), "the goal was reached in the same episode"
    success = hindsight.spec.success(next_obs, goal)
    assert torch.equal(batch.reward.squeeze(-1), hindsight.spec.reward(next_obs, goal))
    assert torch.equal(batch.discount.squeeze(-1) == 0, success), "a relabelled success ends its episode"
    # random steps seldom reach the target the task set; a goal they reached later often lies close by
    assert stored_success.float().mean() < 0.1 and success.float().mean() > 0.5

    offline = learner.storage.offline
    assert len(offline) == 20
    corrected = offline.sample(256)
    reached = offline.next_obs["ee_pos"][:20, 0]
    goal = corrected.obs["target"]
    assert all((reached == g).all(-1).any() for g in goal), "the goals are where the corrected steps reached"
    assert torch.equal(corrected.reward.squeeze(-1), hindsight.spec.reward(corrected.next_obs, goal))


def test_a_learner_refuses_relabelling_it_could_not_compute_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"her_ratio=0\.8: task 'panda_pick_cube' has no goal to relabel"):
        _learner(tmp_path / "pick", "task=panda_pick_cube", "her_ratio=0.8")
    with pytest.raises(ValueError, match=r"her_ratio must be in \[0, 1\], got 1\.5"):
        _learner(tmp_path / "bad", "her_ratio=1.5")
    reach = _learner(tmp_path / "reach", "task=panda_reach")
    reach.wal.close()
    assert reach.storage.make_buffer(1).hindsight is None  # off by default
