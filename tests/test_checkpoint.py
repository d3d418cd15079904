import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from robotrl.agents import SAC, SACConfig
from robotrl.data import ReplayBuffer, TensorSpec
from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

SPEC = {"state": TensorSpec((4,))}


def _filled(n=50):
    buf = ReplayBuffer(SPEC, 2, capacity=100)
    for t in range(n):
        o = {"state": torch.randn(1, 4)}
        buf.add(o, torch.rand(1, 2), torch.randn(1), o, torch.tensor([t % 7 == 0]), torch.tensor([False]))
    return buf


def test_round_trip_restores_agent_optimizers_replay_and_rng(tmp_path):
    agent, buf = SAC(SACConfig(), SPEC, 2), _filled()
    for _ in range(3):
        agent.update(buf.sample(16))
    save_checkpoint(tmp_path, 50, agent, buf, {"env_step": 50, "updates": 3})
    expected_noise = torch.rand(5)  # drawn right after saving: the restored RNG must replay it

    other_agent, other_buf = SAC(SACConfig(), SPEC, 2), ReplayBuffer(SPEC, 2, capacity=100)
    counters = load_checkpoint(latest_checkpoint(tmp_path), other_agent, other_buf)
    assert counters == {"env_step": 50, "updates": 3}
    assert torch.equal(torch.rand(5), expected_noise)
    for (name, a), b in zip(agent.state_dict().items(), other_agent.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for name, opt in agent.optimizers().items():
        other = other_agent.optimizers()[name]
        for pa, pb in zip(opt.param_groups[0]["params"], other.param_groups[0]["params"], strict=True):
            for slot, value in opt.state[pa].items():
                assert torch.equal(value, other.state[pb][slot]), (name, slot)
    assert torch.equal(buf.obs["state"], other_buf.obs["state"]) and other_buf.pos == buf.pos
    # identical state + identical RNG => identical next update
    batch = buf.sample(16)
    torch.manual_seed(9)
    m1 = agent.update(batch)
    torch.manual_seed(9)
    m2 = other_agent.update(batch)
    assert torch.equal(m1["critic_loss"], m2["critic_loss"]) and torch.equal(m1["actor_loss"], m2["actor_loss"])


def test_old_checkpoints_are_pruned_and_latest_points_at_the_newest(tmp_path):
    agent = SAC(SACConfig(actor_hidden=[8], critic_hidden=[8]), SPEC, 2)
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, agent, None, {"env_step": step}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000030", "step_000000040"]
    assert latest_checkpoint(tmp_path).name == "step_000000040"
    with pytest.raises(FileNotFoundError, match="no replay"):
        load_checkpoint(latest_checkpoint(tmp_path), agent, ReplayBuffer(SPEC, 2, capacity=10))


def test_saving_the_same_step_again_keeps_latest_on_a_complete_checkpoint(tmp_path, monkeypatch):
    import robotrl.runtime.checkpoint as checkpoint

    agent = SAC(SACConfig(actor_hidden=[8], critic_hidden=[8]), SPEC, 2)
    save_checkpoint(tmp_path, 10, agent, None, {"env_step": 10})
    real_rmtree = checkpoint.shutil.rmtree

    def killed_while_replacing(path, *args, **kwargs):
        real_rmtree(path, *args, **kwargs)
        if path.name == "step_000000010":  # the old copy is gone, the new one not yet renamed
            assert (latest_checkpoint(tmp_path) / "state.json").exists()
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_while_replacing)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 10, agent, None, {"env_step": 10, "again": True})
    assert load_checkpoint(latest_checkpoint(tmp_path), agent)["again"] is True  # the new copy, complete
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    save_checkpoint(tmp_path, 20, agent, None, {"env_step": 20}, keep=2)  # the next save finishes the rename
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_000000010", "step_000000020"]
    assert load_checkpoint(tmp_path / "step_000000010", agent)["again"] is True
    assert latest_checkpoint(tmp_path).name == "step_000000020"


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    agent = SAC(SACConfig(actor_hidden=[8], critic_hidden=[8]), SPEC, 2)
    save_checkpoint(tmp_path, 1, agent, None, {})
    with torch.no_grad():
        next(agent.critic.parameters()).fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="critic"):
        save_checkpoint(tmp_path, 2, agent, None, {})
    assert latest_checkpoint(tmp_path).name == "step_000000001"


WRITER = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from robotrl.agents import SAC, SACConfig
    from robotrl.data import ReplayBuffer, TensorSpec
    from robotrl.runtime.checkpoint import save_checkpoint
    spec = {"state": TensorSpec((256,))}
    agent = SAC(SACConfig(), spec, 8)
    buf = ReplayBuffer(spec, 8, capacity=20000)
    buf.pos, buf.full = 0, True
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            for p in agent.parameters():
                p.fill_(step)
        buf.reward.fill_(step)
        save_checkpoint(Path(sys.argv[1]), step, agent, buf, {"env_step": step})
        print(step, flush=True)
    """
)


def test_sigkill_during_writes_leaves_a_complete_latest_checkpoint(tmp_path):
    """Kill a process that writes ~40 MB checkpoints back to back, at several points of its writes."""
    for delay in (0.05, 0.13, 0.29, 0.41):
        root = tmp_path / f"kill_{delay}"
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()  # one checkpoint is complete
            assert first.strip() == "1", first
            time.sleep(delay)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        ckpt = latest_checkpoint(root)
        step = int(ckpt.name.split("_")[1])
        agent = SAC(SACConfig(), {"state": TensorSpec((256,))}, 8)
        buf = ReplayBuffer({"state": TensorSpec((256,))}, 8, capacity=20000)
        assert load_checkpoint(ckpt, agent, buf, restore_rng=False) == {"env_step": step}
        assert all(torch.all(p == step) for p in agent.parameters())
        assert torch.all(buf.reward == step)
