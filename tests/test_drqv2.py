"""DrQ-v2 and its pixel plumbing: random shifts, frame stacking, the frame-once replay, the agent."""

import json

import pytest
import torch
from helpers import run_module
from robotrl.tasks import make_env
from robotrl.tasks.configs import ArmTaskConfig

from robotrl.agents import DrQv2, DrQv2Config
from robotrl.agents.config import EncoderConfig
from robotrl.core.spec import TensorSpec
from robotrl.data.frame_replay import FrameReplay
from robotrl.data.replay import ReplayBuffer
from robotrl.nn.augment import crop_each, crop_gathered, random_shift
from robotrl.runtime.frame_stack import FrameStack

K = 3


def test_random_shift_moves_each_image_within_the_pad():
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 20, 20), dtype=torch.uint8, generator=generator)
    shifted = random_shift(images, pad=4)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8
    padded = images.float()
    padded = torch.nn.functional.pad(padded, (4, 4, 4, 4), mode="replicate")
    offsets = set()
    for b in range(64):  # every output is a crop of the replicate-padded image at a corner within the pad
        found = [
            (dy, dx)
            for dy in range(9)
            for dx in range(9)
            if torch.equal(padded[b, :, dy : dy + 20, dx : dx + 20], shifted[b].float())
        ]
        assert found, f"image {b} is not a shift within the pad"
        offsets.add(found[0])
    assert len(offsets) > 10  # offsets differ across the batch
    assert torch.equal(random_shift(images, pad=0), images)
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        random_shift(images[0])


def test_the_gpu_crop_equals_the_per_image_crop():
    """The accelerator path (one gather, no host sync) cuts the same crops as the CPU path."""
    generator = torch.Generator().manual_seed(1)
    padded = torch.randint(0, 256, (32, 9, 28, 30), dtype=torch.uint8, generator=generator)
    corners = torch.stack(
        [torch.randint(0, 9, (32,), generator=generator), torch.randint(0, 11, (32,), generator=generator)], 1
    )
    gathered = crop_gathered(padded, corners, (20, 20))
    assert gathered.is_contiguous() and gathered.shape == (32, 9, 20, 20)
    assert torch.equal(gathered, crop_each(padded, corners, (20, 20)))


def _frames(num_envs, steps, generator):
    return torch.randint(0, 256, (steps, num_envs, 3, 8, 8), dtype=torch.uint8, generator=generator)


def _stack(history):
    """Reference stacking: the last K frames, the episode's first repeated at its start."""
    padded = [history[0]] * (K - len(history)) + history[-K:]
    return torch.cat(padded[-K:], 0)


def _fill(replay, num_envs, steps, episode_len, seed=0):
    """Add `steps` steps of synthetic episodes (env e ends every episode_len + e steps); returns every
    transition's expected (obs stack, next stack) keyed by (row, env) of the write."""
    generator = torch.Generator().manual_seed(seed)
    frames = _frames(num_envs, steps + 1, generator)
    history = [[frames[0, e]] for e in range(num_envs)]
    expected = {}
    for t in range(steps):
        row = replay.pos
        obs = torch.stack([_stack(history[e]) for e in range(num_envs)])
        ends = torch.tensor([(len(history[e])) % (episode_len + e) == 0 for e in range(num_envs)])
        next_history = [history[e] + [frames[t + 1, e]] for e in range(num_envs)]
        next_obs = torch.stack([_stack(next_history[e]) for e in range(num_envs)])
        terminated = ends & (torch.arange(num_envs) % 2 == 0)
        truncated = ends & ~terminated
        replay.add(
            {"pixels": obs, "state": obs[:, :1, 0, 0].float()},
            torch.full((num_envs, 2), float(t)),
            torch.full((num_envs,), float(t)),
            {"pixels": next_obs, "state": next_obs[:, :1, 0, 0].float()},
            terminated,
            truncated,
        )
        for e in range(num_envs):
            expected[(row, e)] = (obs[e], next_obs[e])
            # the next episode starts from a fresh frame (the env's reset observation)
            fresh = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=generator)
            history[e] = [fresh] if ends[e] else next_history[e]
            if ends[e]:
                frames[t + 1, e] = history[e][0]
    return expected


SPEC = {"pixels": TensorSpec((3 * K, 8, 8), torch.uint8), "state": TensorSpec((1,))}


@pytest.mark.parametrize(("capacity", "steps"), [(200, 150), (60, 150)])  # no wrap, and wrapped twice
def test_frame_replay_rebuilds_the_stored_stacks_across_episodes_and_wraparound(capacity, steps):
    replay = FrameReplay(SPEC, 2, capacity, num_envs=2, frame_stack=K)
    expected = _fill(replay, 2, steps, episode_len=7)
    row, env = torch.meshgrid(torch.arange(replay.rows_filled), torch.arange(2), indexing="ij")
    row, env = row.flatten(), env.flatten()
    valid = replay._valid(row, env)
    assert valid.float().mean() >= 0.75  # 7-step episodes: one frame in 8 is a final frame
    row, env = row[valid], env[valid]
    obs = replay._stacks(replay.obs_frame[row, env], replay.first_frame[row, env], env)["pixels"]
    nxt = replay._stacks(replay.obs_frame[row, env] + 1, replay.first_frame[row, env], env)["pixels"]
    for i, (r, e) in enumerate(zip(row.tolist(), env.tolist(), strict=True)):
        want_obs, want_next = expected[(r, e)]
        assert torch.equal(obs[i], want_obs), f"obs stack of row {r} env {e}"
        assert torch.equal(nxt[i], want_next), f"next stack of row {r} env {e}"
    batch = replay.sample(64)
    assert batch.obs["pixels"].shape == (64, 3 * K, 8, 8) and batch.obs["pixels"].dtype == torch.uint8
    assert batch.obs["state"].shape == (64, 1)


def test_frame_replay_n_step_targets_match_the_plain_replay():
    plain_spec = {"pixels": TensorSpec((3 * K, 8, 8), torch.uint8), "state": TensorSpec((1,))}
    frames = FrameReplay(plain_spec, 2, 100, num_envs=2, frame_stack=K, n_step=3, gamma=0.9)
    plain = ReplayBuffer(plain_spec, 2, 100, num_envs=2, n_step=3, gamma=0.9)
    _fill(frames, 2, 80, episode_len=5, seed=1)
    _fill(plain, 2, 80, episode_len=5, seed=1)
    row = torch.arange(frames.rows_filled).repeat(2)
    env = torch.arange(2).repeat_interleave(frames.rows_filled)
    keep = frames._valid(row, env)
    row, env = row[keep], env[keep]
    for a, b in zip(frames._n_step(row, env), plain._n_step(row, env), strict=True):
        assert torch.equal(a, b)
    # the n-step next observation is the stack stored as next_obs of the last summed transition
    _, _, last = frames._n_step(row, env)
    rebuilt = frames._stacks(frames.obs_frame[last, env] + 1, frames.first_frame[last, env], env)["pixels"]
    assert torch.equal(rebuilt, plain.next_obs["pixels"][last, env])


def test_frame_replay_stores_each_frame_once_and_survives_a_checkpoint():
    spec = {"pixels": TensorSpec((3 * K, 84, 84), torch.uint8)}
    replay = FrameReplay(spec, 4, 1000, frame_stack=K)
    frame_bytes = 3 * 84 * 84
    assert replay.nbytes() / 1000 / frame_bytes < 1.01
    small = FrameReplay(SPEC, 2, 60, num_envs=2, frame_stack=K, n_step=2)
    _fill(small, 2, 90, episode_len=6)
    restored = FrameReplay(SPEC, 2, 60, num_envs=2, frame_stack=K, n_step=2)
    restored.load_state_dict(small.state_dict())
    torch.manual_seed(3)
    a = small.sample(32)
    torch.manual_seed(3)
    b = restored.sample(32)
    for key in a.obs:
        assert torch.equal(a.obs[key], b.obs[key]) and torch.equal(a.next_obs[key], b.next_obs[key])
    assert not restored.episode_open.any()  # a resumed run restarts its episodes


def test_frame_replay_rejects_settings_that_do_not_fit():
    with pytest.raises(ValueError, match=r"agent\.encoder\.frame_stack=3 .* does not fit a replay of 4 steps per env"):
        FrameReplay(SPEC, 2, 8, num_envs=2, frame_stack=3)
    with pytest.raises(ValueError, match=r"not a stack of agent\.encoder\.frame_stack=2"):
        FrameReplay(SPEC, 2, 100, frame_stack=2)
    with pytest.raises(ValueError, match="needs uint8"):
        FrameReplay({"state": TensorSpec((3,))}, 2, 100)


def test_frame_stack_wrapper_stacks_and_restarts_at_episode_ends():
    env = FrameStack(make_env(ArmTaskConfig(obs="state+pixels", image_size=64, episode_steps=3)), K)
    assert env.obs_spec["pixels_front"].shape == (3 * K, 64, 64)
    obs = env.reset(seed=0)
    first = obs["pixels_front"][:, :3]
    assert torch.equal(obs["pixels_front"], first.repeat(1, K, 1, 1))
    result = env.step(torch.ones(1, 3))
    assert torch.equal(result.next_obs["pixels_front"][:, :6], obs["pixels_front"][:, 3:])
    for _ in range(2):
        result = env.step(torch.ones(1, 3))
    assert result.truncated.all()
    reset_frame = result.obs["pixels_front"][:, -3:]
    assert torch.equal(result.obs["pixels_front"], reset_frame.repeat(1, K, 1, 1))
    assert not torch.equal(result.next_obs["pixels_front"][:, -3:], reset_frame)
    with pytest.raises(ValueError, match=r"task\.obs=pixels"):
        FrameStack(make_env(ArmTaskConfig()), K)


def _pixel_spec(size=64):
    return {"pixels_front": TensorSpec((3 * K, size, size), torch.uint8), "arm_qpos": TensorSpec((7,))}


def test_drqv2_acts_explores_on_its_schedule_and_updates():
    torch.manual_seed(0)
    cfg = DrQv2Config(
        hidden=[32],
        batch_size=8,
        std_decay_steps=100,
        std_init=1.0,
        std_final=0.1,
        encoder=EncoderConfig(conv_layers=2),
    )
    agent = DrQv2(cfg, _pixel_spec(), 3)
    obs = {
        "pixels_front": torch.randint(0, 256, (2, 3 * K, 64, 64), dtype=torch.uint8),
        "arm_qpos": torch.randn(2, 7),
    }
    mean = agent.act(obs, deterministic=True)
    assert mean.shape == (2, 3) and torch.equal(mean, agent.act(obs, deterministic=True))
    assert agent.exploration_std() == 1.0
    for _ in range(25):
        agent.advance_exploration(torch.zeros(2, dtype=torch.bool))  # 2 envs: 50 env steps
    assert agent.exploration_std() == pytest.approx(0.55)
    assert (agent.act(obs) - mean).abs().max() > 0.05
    replay = FrameReplay(_pixel_spec(), 3, 100, frame_stack=K, n_step=3)
    for t in range(30):
        one = {k: v[:1] for k, v in obs.items()}
        end = torch.tensor([t % 10 == 9])
        replay.add(one, torch.rand(1, 3) * 2 - 1, torch.ones(1), one, end, torch.zeros(1, dtype=torch.bool))
    encoder_before = [p.clone() for p in agent.encoder.parameters()]
    metrics = agent.update(replay.sample(8))
    assert set(metrics) == {"critic_loss", "actor_loss", "q_mean", "exploration_std"}
    assert all(torch.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(a, b) for a, b in zip(encoder_before, agent.encoder.parameters(), strict=True))


def test_drqv2_refuses_state_only_tasks_and_bad_settings():
    with pytest.raises(ValueError, match=r"agent=drqv2 learns from pixels.*task\.obs=pixels"):
        DrQv2(DrQv2Config(), {"arm_qpos": TensorSpec((7,))}, 3)
    with pytest.raises(ValueError, match=r"agent\.encoder\.frame_stack must be >= 1, got 0"):
        DrQv2(DrQv2Config(encoder=EncoderConfig(frame_stack=0)), _pixel_spec(), 3)
    with pytest.raises(ValueError, match=r"agent\.std_decay_steps"):
        DrQv2Config(std_decay_steps=0).validate()


def test_drqv2_trains_from_pixels_through_the_cli(tmp_path):
    args = [
        "agent=drqv2_light",
        "task=panda_reach",
        "task.obs=state+pixels",
        "task.image_size=64",
        "total_steps=200",
        "learning_starts=100",
        "log_interval=100",
        "eval_interval=200",
        "eval_episodes=1",
        "checkpoint_interval=100",
        "agent.batch_size=16",
        "agent.hidden=[32]",
        "progress=false",
        f"hydra.run.dir={tmp_path}/run",
    ]
    run_module("robotrl.train", *args)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["updates"] == (200 - 100) // 2  # an update every 2 env steps
    run_module("robotrl.train", f"resume={tmp_path}/run", "total_steps=240", "progress=false")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 240
    bad = run_module("robotrl.train", "agent=drqv2", "task=panda_reach", "progress=false", check=False)
    assert bad.returncode != 0 and "task.obs=pixels" in bad.stderr


def test_the_actor_loss_passes_gradient_through_the_action_clamp():
    """DrQ-v2's TruncatedNormal is straight-through: a noisy action beyond +-1 still moves the actor's mean."""
    agent = DrQv2(
        DrQv2Config(hidden=[16], encoder=EncoderConfig(conv_layers=2, conv_stride=2)),
        {"pixels": TensorSpec((9, 64, 64), torch.uint8)},
        2,
    )
    mean = torch.full((4096, 2), 0.95, requires_grad=True)
    action = agent._perturb(mean, torch.tensor(1.0), straight_through=True)
    assert action.abs().max() <= 1.0 and (action == 1.0).float().mean() > 0.2  # many samples clamped
    action.sum().backward()
    assert torch.equal(mean.grad, torch.ones_like(mean))
    hard = agent._perturb(mean.detach().requires_grad_(), torch.tensor(1.0))
    assert hard.abs().max() <= 1.0  # the target's (no gradient needed) stays a plain clamp


def test_a_frame_replay_commits_its_frames_as_written_on_a_cpu_and_whole_on_a_gpu():
    """The start-up memory check sizes buffers on the meta device: on a CPU a FrameReplay's frames (torch.empty)
    take memory only as transitions arrive, so a short run with a large capacity is not refused for frames it
    never stores; CUDA's caching allocator reserves them whole; a ReplayBuffer's zeroed rows count whole."""
    spec = {"pixels_front": TensorSpec((3 * K, 64, 64), torch.uint8), "arm_qpos": TensorSpec((7,))}
    meta = torch.device("meta")
    frames = FrameReplay(spec, 4, 1_000_000, num_envs=2, frame_stack=K, device=meta)
    whole = frames.committed_bytes(1_000_000, torch.device("cpu"))
    assert whole > 1_000_000 * 64 * 64 * 3  # one 64x64 frame per transition, plus the state rows
    short = frames.committed_bytes(20_000, torch.device("cpu"))
    assert short < whole / 10 and short > 20_000 * 64 * 64 * 3
    assert frames.committed_bytes(20_000, torch.device("cuda")) == whole
    rows = ReplayBuffer({"arm_qpos": TensorSpec((7,))}, 4, 1_000_000, device=meta)
    assert rows.committed_bytes(20_000, torch.device("cpu")) == rows.committed_bytes(1_000_000, torch.device("cpu"))
