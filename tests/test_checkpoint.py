import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from robotrl.agents import SAC, SACConfig
from robotrl.data import ReplayBuffer, TensorSpec
from robotrl.runtime.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint

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


def test_a_resumed_optimizer_keeps_its_own_step_implementation(tmp_path):
    """A checkpoint of a fused Adam restores into a foreach one as foreach (and a capturable one, as agent.compile
    builds on a GPU, stays capturable): the saved learning state is loaded, not how the saving run computed it."""
    agent, buf = SAC(SACConfig(), SPEC, 2), _filled()
    agent.update(buf.sample(16))
    assert agent.optimizer.param_groups[0]["fused"]
    save_checkpoint(tmp_path, 50, agent, buf, {"env_step": 50, "updates": 1})

    other = SAC(SACConfig(), SPEC, 2)
    groups = [{"params": g["params"], "lr": g["lr"]} for g in other.optimizer.param_groups]
    other.optimizer = torch.optim.Adam(groups, foreach=True)
    load_checkpoint(latest_checkpoint(tmp_path), other, ReplayBuffer(SPEC, 2, capacity=100))
    group = other.optimizer.param_groups[0]
    assert group["foreach"] and not group["fused"]
    assert group["lr"] == agent.optimizer.param_groups[0]["lr"]
    for pa, pb in zip(agent.optimizer.param_groups[0]["params"], group["params"], strict=True):
        assert torch.equal(agent.optimizer.state[pa]["exp_avg"], other.optimizer.state[pb]["exp_avg"])
    other.update(buf.sample(16))  # the foreach step runs on the restored state


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


# ---- a checkpoint's pointer and bytes are checked before anything is trusted ---------------------------------


def _tiny_agent():
    return SAC(SACConfig(actor_hidden=[8], critic_hidden=[8]), SPEC, 2)


def test_a_pointer_that_leaves_checkpoints_is_refused_and_deletes_nothing(tmp_path):
    """`latest` holding `.tmp_step_/../../victim_1` made a save finish an "interrupted replace": it deleted
    `victim`, a directory beside `checkpoints/`, and moved `victim_1` in its place."""
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, _tiny_agent(), None, {})
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "precious").write_text("keep me")
    (tmp_path / "victim_1").mkdir()
    (root / ".tmp_step_").mkdir()
    (root / "step_").mkdir()
    (root / "latest").write_text(".tmp_step_/../../victim_1")
    with pytest.raises(CheckpointError, match=r"\.tmp_step_/\.\./\.\./victim_1"):
        save_checkpoint(root, 2, _tiny_agent(), None, {})
    assert (tmp_path / "victim" / "precious").read_text() == "keep me"
    with pytest.raises(CheckpointError, match=r"\.tmp_step_/\.\./\.\./victim_1"):
        latest_checkpoint(root)


def test_a_pointer_to_a_checkpoint_elsewhere_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    save_checkpoint(elsewhere, 7, _tiny_agent(), None, {})
    root = tmp_path / "run" / "checkpoints"
    save_checkpoint(root, 1, _tiny_agent(), None, {})
    (root / "latest").write_text(str(elsewhere / "step_000000007"))  # absolute
    with pytest.raises(CheckpointError, match=re.escape(str(elsewhere / "step_000000007"))):
        latest_checkpoint(root)
    # a well-named checkpoint that is a link out of checkpoints/
    (root / "step_000000009").symlink_to(elsewhere / "step_000000007")
    (root / "latest").write_text("step_000000009")
    with pytest.raises(CheckpointError, match=r"step_000000009.*outside"):
        latest_checkpoint(root)


def _flip_a_bit(path, offset_from_end=10):
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "name", ["agent.safetensors", "optim_sac.safetensors", "replay.safetensors", "rng.safetensors", "state.json"]
)
def test_a_flipped_bit_in_any_checkpoint_file_is_reported_by_path(tmp_path, name):
    agent = _tiny_agent()
    save_checkpoint(tmp_path, 1, agent, _filled(), {"env_step": 1})
    ckpt = latest_checkpoint(tmp_path)
    _flip_a_bit(ckpt / name)
    with pytest.raises(CheckpointError, match=re.escape(f"{ckpt / name}: checksum mismatch")):
        load_checkpoint(ckpt, _tiny_agent(), ReplayBuffer(SPEC, 2, capacity=100))


def test_a_truncated_weights_file_is_reported_by_path_and_nothing_is_loaded(tmp_path):
    save_checkpoint(tmp_path, 1, _tiny_agent(), None, {"env_step": 1})
    ckpt = latest_checkpoint(tmp_path)
    weights = ckpt / "agent.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    agent = _tiny_agent()
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    with pytest.raises(CheckpointError, match=re.escape(str(weights))):
        load_checkpoint(ckpt, agent)
    assert all(torch.equal(before[k], v) for k, v in agent.state_dict().items())


def _without_manifest(ckpt):
    (ckpt / "manifest.json").unlink(missing_ok=True)
    return ckpt


@pytest.mark.parametrize(
    ("name", "garbage"),
    [("agent.safetensors", b"\x00" * 3), ("agent.safetensors", b"garbage" * 20), ("state.json", b"{not json")],
)
def test_garbage_in_an_unchecksummed_checkpoint_names_the_file(tmp_path, name, garbage):
    """A checkpoint saved before checksums were recorded still fails with its file's path, not a raw parse error."""
    save_checkpoint(tmp_path, 1, _tiny_agent(), None, {"env_step": 1})
    ckpt = _without_manifest(latest_checkpoint(tmp_path))
    (ckpt / name).write_bytes(garbage)
    with pytest.raises(CheckpointError, match=re.escape(str(ckpt / name))):
        load_checkpoint(ckpt, _tiny_agent())


def test_a_checkpoint_without_a_manifest_loads_with_a_warning_naming_it(tmp_path, caplog):
    agent = _tiny_agent()
    save_checkpoint(tmp_path, 1, agent, None, {"env_step": 1})
    ckpt = _without_manifest(latest_checkpoint(tmp_path))
    restored = _tiny_agent()
    with caplog.at_level("WARNING", logger="robotrl.runtime.checkpoint"):
        assert load_checkpoint(ckpt, restored) == {"env_step": 1}
    assert str(ckpt / "manifest.json") in caplog.text
    for (name, a), b in zip(agent.state_dict().items(), restored.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_non_finite_weights_are_refused_on_load_naming_the_tensor(tmp_path):
    """Weights that were never finite-checked (written by other code, or an older saver) with a matching checksum."""
    save_checkpoint(tmp_path, 1, _tiny_agent(), None, {"env_step": 1})
    ckpt = latest_checkpoint(tmp_path)
    weights = ckpt / "agent.safetensors"
    tensors = load_file(str(weights))
    name = next(k for k in tensors if k.startswith("critic") and tensors[k].is_floating_point())
    tensors[name][0] = float("inf")
    save_file(tensors, str(weights))
    manifest = ckpt / "manifest.json"
    if manifest.exists():
        raw = json.loads(manifest.read_text())
        raw["files"]["agent.safetensors"] = hashlib.sha256(weights.read_bytes()).hexdigest()
        manifest.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(weights))}.*{re.escape(name)}.*not finite"):
        load_checkpoint(ckpt, _tiny_agent())


def test_the_manifest_holds_every_file_of_the_checkpoint_with_its_sha256(tmp_path):
    save_checkpoint(tmp_path, 1, _tiny_agent(), _filled(), {"env_step": 1})
    ckpt = latest_checkpoint(tmp_path)
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    on_disk = {p.name for p in ckpt.iterdir()} - {"manifest.json"}
    assert set(files) == on_disk
    for name, digest in files.items():
        assert hashlib.sha256((ckpt / name).read_bytes()).hexdigest() == digest, name
