"""The real entry points, end to end: robotrl-train, resume after SIGKILL, robotrl-eval, multirun."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import REPO, TINY, run_module
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError

from robotrl.config import EvalConfig, register_configs, strict_object, to_train_config
from robotrl.runtime.checkpoint import latest_checkpoint
from robotrl.runtime.loop import train
from robotrl.runtime.metrics import NonFiniteError, read_metrics

register_configs()


def _compose(*overrides):
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


ENTRY_POINTS = [
    "robotrl.train",
    "robotrl.eval",
    "robotrl.record",
    "robotrl.train_classifier",
    "robotrl.actor",
    "robotrl.learner",
    "robotrl.hardware.sim_twin",
    "robotrl.hardware.deploy",
]


def test_every_entry_point_refuses_a_key_its_schema_lacks_even_with_a_plus(tmp_path):
    """`+key=value` gets past Hydra's composition into a typed node; each program's schema merge must still refuse
    it, naming it, before doing anything (a typo that trained silently also broke the run's resume later). The
    refusal is one line naming the program, without a traceback; the traceback goes to the run's log file."""
    for module in ENTRY_POINTS:
        proc = run_module(module, "+speling_mistake=3", f"hydra.run.dir={tmp_path / module}", check=False)
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"{module} accepted +speling_mistake=3:\n{output[-2000:]}"
        program = "robotrl-" + module.rsplit(".", 1)[1].replace("_", "-")
        assert f"{program}: error: Key 'speling_mistake' not in" in output, f"{module}:\n{output[-2000:]}"
        assert "Traceback" not in output, f"{module}:\n{output[-2000:]}"
    log = (tmp_path / "robotrl.train" / "train.log").read_text()
    assert "Traceback" in log and "speling_mistake" in log


def test_config_errors_name_the_key_or_list_the_options():
    with pytest.raises(MissingConfigException, match=r"(?s)agent/ppo.*Available options.*sac"):
        _compose("agent=ppo")
    with pytest.raises(MissingConfigException, match=r"(?s)task/nope.*Available options.*gym.*panda_reach"):
        _compose("task=nope")
    with pytest.raises(ConfigCompositionException) as err:
        _compose("agent.batch_sise=64")
    assert "batch_sise" in str(err.value.__cause__)
    # `+key=value` slips a key past composition into a typed node; the schema merge still refuses it
    with pytest.raises(ConfigKeyError, match="batch_sise"):
        to_train_config(_compose("+agent.batch_sise=64"))
    with pytest.raises(ConfigKeyError, match="evaluation_episodes"):
        with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
            strict_object(EvalConfig, compose(config_name="eval", overrides=["run=x", "+evaluation_episodes=3"]))
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N, got 'tpu'"):
        EvalConfig(run="x", device="tpu").validate()
    with pytest.raises(ConfigCompositionException) as err:
        _compose("total_steps=many")
    assert "total_steps" in str(err.value.__cause__)
    with pytest.raises(ValueError, match="eval_episodes must be >= 1"):
        to_train_config(_compose("eval_episodes=0"))
    with pytest.raises(ValueError, match="seed must be >= 0, got -5"):  # gymnasium refused it later, unnamed
        to_train_config(_compose("seed=-5"))
    # non-finite numbers fail here, named, not as a NaN loss some updates in
    for override, message in [
        ("agent.actor_lr=inf", r"agent\.actor_lr must be a finite number > 0\.0, got inf"),
        ("agent.target_entropy=nan", r"agent\.target_entropy must be a finite number"),
        ("agent.critic_hidden=[256,0]", r"agent\.critic_hidden must list layer widths >= 1, got \[256, 0\]"),
        ("agent.bc_weight=inf", r"agent\.bc_weight must be a finite number >= 0"),
        ("hil.teleop_gain=inf", r"hil\.teleop_gain must be a finite number > 0"),
        ("learning_starts=5000", r"learning_starts \(5000\) must be below total_steps \(2000\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            to_train_config(_compose("total_steps=2000", override))
    with pytest.raises(ValueError, match=r"agent\.std_init must be a finite number >= 0\.0, got inf"):
        to_train_config(_compose("agent=drqv2", "agent.std_init=inf"))
    with pytest.raises(ValueError, match=r"agent\.lr must be a finite number > 0\.0, got nan"):
        to_train_config(_compose("agent=bc", "agent.lr=nan"))
    with pytest.raises(ConfigCompositionException, match=r"gamma"):  # BC's loss has no discount to set
        _compose("agent=bc", "agent.gamma=0.9")
    with pytest.raises(ValueError, match=r"agent\.encoder\.conv_layers must be >= 1, got 0"):
        to_train_config(_compose("agent=drqv2", "agent.encoder.conv_layers=0"))
    cfg = to_train_config(_compose("task=gym", "task.env_id=HalfCheetah-v5", "agent.num_critics=4"))
    assert cfg.task.env_id == "HalfCheetah-v5" and cfg.agent.num_critics == 4


def test_train_writes_config_metrics_checkpoints_video_and_plot(tmp_path):
    run_dir = tmp_path / "run"
    run_module("robotrl.train", *TINY, f"hydra.run.dir={run_dir}")
    assert (run_dir / "config.yaml").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 600 and summary["updates"] == 400
    series = read_metrics(run_dir / "metrics.csv")
    assert {"critic_loss", "actor_loss", "train/episode_return", "eval/return"} <= set(series)
    assert [s for s, _ in series["eval/return"]] == [300, 600]
    assert any((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "videos" / "eval_step_000000600.mp4").stat().st_size > 1000
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    assert latest_checkpoint(run_dir / "checkpoints").name == "step_000000600"

    proc = run_module("robotrl.eval", f"run={run_dir}", "episodes=2")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 2 and result["checkpoint"] == "step_000000600" and "return" in result
    assert any(run_dir.glob("eval/*/eval.mp4"))


def test_resume_after_sigkill_continues_the_same_run(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for a in TINY if not a.startswith(("total_steps", "checkpoint_interval", "eval_interval"))]
    args += ["total_steps=1500", "checkpoint_interval=250", "eval_interval=100000", "video=false"]
    env = dict(os.environ, MUJOCO_GL="egl")
    proc = subprocess.Popen(
        [sys.executable, "-m", "robotrl.train", *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pointer = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (pointer.exists() and pointer.read_text() >= "step_000000500"):
        assert proc.poll() is None, "training ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = int(latest_checkpoint(run_dir / "checkpoints").name.split("_")[1])
    assert 500 <= killed_at < 1500

    run_module("robotrl.train", f"resume={run_dir}", "progress=false")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 1500
    assert summary["updates"] == 1500 - 200  # counters continued, not restarted
    rows = read_metrics(run_dir / "metrics.csv")["critic_loss"]
    steps = [s for s, _ in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 1500  # one continuous curve, no duplicate rows

    with pytest.raises(AssertionError, match="cannot change 'seed'"):
        run_module("robotrl.train", f"resume={run_dir}", "seed=5")
    # the original command line with resume= added: unchanged fixed keys are accepted; the run is complete
    rows_before = (run_dir / "metrics.csv").read_text()
    run_module("robotrl.train", *args, f"resume={run_dir}", "seed=1")
    assert (run_dir / "metrics.csv").read_text() == rows_before  # no second final evaluation


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    # An absurd learning rate makes the critic overflow after learning starts at step 600.
    cfg = to_train_config(
        _compose(
            *[a for a in TINY if not a.startswith("total_steps")],
            "total_steps=2000",
            "learning_starts=600",
            "agent.critic_lr=1e30",
            "video=false",
        )
    )
    with pytest.raises(NonFiniteError, match=r"(critic_loss|q_mean|actor_loss).*checkpoint, step_000000600, is kept"):
        train(cfg, tmp_path)
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert ckpt.name == "step_000000600"
    with pytest.raises(NonFiniteError, match="no checkpoint had been written yet"):  # diverged before the first
        train(replace(cfg, learning_starts=100, checkpoint_interval=5000), tmp_path / "early")


def test_multirun_gives_each_seed_its_own_run_dir(tmp_path):
    run_module(
        "robotrl.train",
        "-m",
        "seed=1,2",
        *[a for a in TINY if not a.startswith("total_steps")],
        "total_steps=250",
        "video=false",
        f"hydra.sweep.dir={tmp_path}",
    )
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and (p / "summary.json").exists())
    assert [p.name for p in runs] == ["0_gym_sac_s1", "1_gym_sac_s2"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sac_learns_pendulum(tmp_path):
    """Mean return over 10 deterministic evaluation episodes passes -300 within 5000 env steps."""
    cfg = to_train_config(
        _compose(
            "task=gym",
            "seed=3",
            "total_steps=5000",
            "learning_starts=500",
            "agent.actor_lr=1e-3",
            "agent.critic_lr=1e-3",
            "agent.alpha_lr=1e-3",
            # 64 units learn Pendulum as fast as 256 (seed 3: past -300 by 3,500 steps either way) at 0.6 of the
            # time on one thread (261 against 440 s, each beside another run and a background bench, 2026-11-28)
            "agent.actor_hidden=[64,64]",
            "agent.critic_hidden=[64,64]",
            "eval_interval=1000",
            "eval_episodes=10",
            "checkpoint_interval=100000",
            "progress=false",
            "video=false",
        )
    )
    train(cfg, Path(tmp_path))
    evals = read_metrics(Path(tmp_path) / "metrics.csv")["eval/return"]
    assert evals[0][1] < -700, evals  # it starts out unable to swing up ...
    assert max(v for _, v in evals) > -300, evals  # ... and learns to


def test_default_job_runs_panda_reach(tmp_path):
    """The README's main job (defaults: SAC on panda_reach), shortened: every artifact appears. Its learning claim
    (100% success by about 8k env steps) is bench/main_job.py's: its 7,000 updates of 256-unit networks took about
    200 s of a 2-core machine's suite (2026-11-28), a long learning run that belongs in bench/."""
    run_module(
        "robotrl.train",
        "total_steps=300",
        "learning_starts=100",
        "eval_interval=300",
        "eval_episodes=1",
        "agent.batch_size=32",
        "progress=false",
        f"hydra.run.dir={tmp_path}",
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_steps"] == 300 and "eval/success" in summary
    assert (tmp_path / "videos" / "eval_step_000000300.mp4").stat().st_size > 1000


def test_top_level_backend_sets_the_tasks_backend_and_wins_over_task_backend():
    cfg = to_train_config(_compose("backend=genesis", "num_envs=64", "task=panda_reach"))
    assert cfg.backend == "genesis" and cfg.task.backend == "genesis" and cfg.num_envs == 64
    assert to_train_config(_compose()).task.backend == "mujoco"  # unset: the task's own
    assert to_train_config(_compose("task.backend=genesis")).task.backend == "genesis"
    assert to_train_config(_compose("backend=mujoco", "task.backend=genesis")).task.backend == "mujoco"  # top wins
    with pytest.raises(ValueError, match=r"backend must be one of mujoco, genesis, mujoco_warp, got 'bullet'"):
        to_train_config(_compose("backend=bullet"))
    with pytest.raises(ValueError, match=r"task.backend must be one of mujoco, genesis, mujoco_warp, got 'isaac'"):
        to_train_config(_compose("task.backend=isaac"))
    with pytest.raises(ValueError, match=r"backend=genesis: task=gym has no simulator backend"):
        to_train_config(_compose("task=gym", "backend=genesis"))


# TINY on four envs, 400 env steps, updates from 202 (not a multiple of num_envs: the first batch is partly before
# it), no evaluation or checkpoint before the end
FOUR_ENVS = [
    *(a for a in TINY if not a.startswith(("total_steps", "learning_starts", "eval_interval", "checkpoint_interval"))),
    "num_envs=4",
    "total_steps=400",
    "learning_starts=202",
    "eval_interval=100000",
    "checkpoint_interval=100000",
    "video=false",
]


def test_batched_collection_adds_one_batch_per_step_and_keeps_utd_per_env_step(tmp_path, monkeypatch):
    """num_envs=4: each loop step adds one [4, ...] batch; updates count env steps (utd_ratio per env step)."""
    from robotrl.data.replay import ReplayBuffer

    batches = []
    add = ReplayBuffer.add
    monkeypatch.setattr(
        ReplayBuffer, "add", lambda self, obs, *rest: (batches.append(len(rest[0])), add(self, obs, *rest))
    )
    cfg = to_train_config(
        _compose(
            *FOUR_ENVS,
            "agent.utd_ratio=2",
        )
    )
    summary = train(cfg, tmp_path)
    assert summary["env_steps"] == 400 and batches == [4] * 100
    assert summary["updates"] == 2 * (400 - 202)  # as with one env: utd_ratio updates per env step past it


def test_updates_per_vectorized_step_schedule_the_loop(tmp_path):
    """agent.updates_per_step=0.5 with 4 envs: one update every two vectorized steps past learning_starts."""
    cfg = to_train_config(
        _compose(
            *FOUR_ENVS,
            "agent.updates_per_step=0.5",
        )
    )
    summary = train(cfg, tmp_path)
    assert summary["updates"] == 24  # floor(0.5 * (400 - 202) / 4)
    with pytest.raises(ValueError, match=r"agent.updates_per_step=2.0 replaces agent.utd_ratio"):
        to_train_config(_compose(*FOUR_ENVS, "agent.updates_per_step=2", "agent.utd_ratio=2"))
    with pytest.raises(ValueError, match=r"makes 16 updates in one vectorized step, more than the 12 transitions"):
        to_train_config(_compose(*FOUR_ENVS, "learning_starts=10", "agent.utd_ratio=4"))


def test_a_num_envs_the_machine_cannot_hold_fails_before_training_with_the_memory_needed(tmp_path):
    for backend in ("mujoco", "genesis"):  # the check runs before Genesis is imported: no extra needed
        cfg = to_train_config(_compose(f"backend={backend}", "num_envs=1000000000", "video=false"))
        with pytest.raises(MemoryError, match=rf"num_envs=1000000000 on the {backend} backend needs about [\d.]+ GB"):
            train(cfg, tmp_path / backend)
        assert not (tmp_path / backend / "checkpoints").exists()


def test_a_replay_the_machine_cannot_hold_fails_before_training_naming_replay_capacity(tmp_path):
    # sized on the meta device: the check allocates nothing, and names the setting instead of an allocator's bytes
    cfg = to_train_config(_compose(*TINY, "replay_capacity=10000000000000", "video=false"))
    with pytest.raises(MemoryError, match=r"replay_capacity=10000000000000: \d+\.\d GB.*lower replay_capacity"):
        train(cfg, tmp_path)
    assert not (tmp_path / "metrics.csv").exists()


def test_resume_of_a_path_that_is_no_run_fails_and_leaves_nothing_behind(tmp_path):
    typo = tmp_path / "runs" / "no_such_run"
    proc = run_module("robotrl.train", f"resume={typo}", check=False)
    assert proc.returncode != 0 and "not a robotrl run directory" in proc.stderr
    assert not typo.exists()
