"""`logger=wandb`: Weights & Biases in offline mode (no account, no network), read back from the run's own
transaction log (.wandb: W&B's records in LevelDB's log format) with W&B's protobuf definitions."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, TINY, LearnerProcess, free_port, join_actor, run_module, start_actor
from hydra import compose, initialize_config_module

from robotrl.config import register_configs, to_train_config
from robotrl.runtime.metrics import read_metrics
from robotrl.runtime.tracking import RUN_ID_FILE

pytest.importorskip("wandb", reason='wandb is not installed (pip install -e ".[tracking]")')
from wandb.proto import wandb_internal_pb2

register_configs()

BLOCK, RECORD_HEADER = 32768, 7  # LevelDB log: 32 KiB blocks; each record has crc32, length, type
FULL, LAST = 1, 4


def wandb_records(path: Path):
    """The records of one offline run's .wandb file, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + RECORD_HEADER <= len(data):
        if BLOCK - pos % BLOCK < RECORD_HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        if kind == 0:
            break
        pending += data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_runs(wandb_dir: Path) -> list[Path]:
    return sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))


def logged(path: Path) -> tuple[dict, list[dict], list[str]]:
    """(config, history rows, files) of one offline run."""
    config, rows, files = {}, [], []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            rows.append(
                {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "files":
            files += [f.path for f in record.files.files]
    return config, rows, files


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, its files in a fresh folder (WANDB_DIR), nothing written to the home directory."""
    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    return wandb_dir


def test_logger_wandb_logs_config_metrics_video_and_curve_and_resume_goes_on_in_the_same_run(tmp_path, offline_wandb):
    run_dir = tmp_path / "run"
    short = [a for a in TINY if not a.startswith(("total_steps", "learning_starts", "eval_", "checkpoint_interval"))]
    short += ["total_steps=200", "learning_starts=100", "eval_episodes=1", "threads=1"]  # 1: no OpenMP contention
    run_module("robotrl.train", *short, "logger=wandb", "wandb.tags=[ci]", f"hydra.run.dir={run_dir}")
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    [first] = offline_runs(offline_wandb)
    assert first.name == f"run-{run_id}.wandb"
    config, rows, files = logged(first)
    assert config["seed"] == 1 and config["logger"] == "wandb" and config["task"]["env_id"] == "Pendulum-v1"
    steps = {row["env_step"] for row in rows if "train/episode_return" in row}
    assert steps == {100, 200}, rows
    final = [row for row in rows if "eval/return" in row]
    assert len(final) == 1 and final[0]["env_step"] == 200
    assert any(f.startswith("media/videos/eval/video_") and f.endswith(".mp4") for f in files), files
    assert any(f.startswith("media/images/learning_curve_") and f.endswith(".png") for f in files), files

    run_module("robotrl.train", f"resume={run_dir}", "total_steps=300")
    assert (run_dir / RUN_ID_FILE).read_text().strip() == run_id
    second = [p for p in offline_runs(offline_wandb) if p != first]
    assert [p.name for p in second] == [f"run-{run_id}.wandb"]  # `wandb sync` uploads both as one run
    _, rows, _ = logged(second[0])
    assert {row["env_step"] for row in rows if "train/episode_return" in row} == {300}


def test_learner_logs_to_wandb_in_its_run_directory(tmp_path, offline_wandb, monkeypatch):
    """Without WANDB_DIR the W&B files go in the run directory, beside metrics.csv and tb/."""
    from robotrl.tasks.configs import GymTaskConfig

    from robotrl.actor import ActorConfig
    from robotrl.runtime.transport.config import ConnectConfig

    monkeypatch.delenv("WANDB_DIR")
    run_dir = tmp_path / "learner"
    learner = LearnerProcess(run_dir, free_port(), "total_steps=300", "log_interval=100", "logger=wandb")
    try:
        connect = ConnectConfig(address=f"127.0.0.1:{learner.port}", heartbeat_s=0.2, backoff_max_s=0.3)
        task = GymTaskConfig(env_id="Pendulum-v1", max_episode_steps=50)
        cfg = ActorConfig(learner=connect, task=task, batch_steps=10, control_hz=0.0, max_steps_ahead=100)
        _, _, thread, result = start_actor(cfg)
        join_actor(thread, result, timeout=120)
        assert learner.proc.wait(60) == 0, learner.output()
    finally:
        learner.stop()
    [run] = offline_runs(run_dir)
    config, rows, _ = logged(run)
    assert run.name == f"run-{(run_dir / RUN_ID_FILE).read_text().strip()}.wandb"
    assert "port" in config["server"] and config["total_steps"] == 300
    in_csv = [step for step, _ in read_metrics(run_dir / "metrics.csv")["learner/updates_per_s"]]
    assert len(in_csv) >= 2 and [row["env_step"] for row in rows if "learner/updates_per_s" in row] == in_csv


def test_bad_logger_settings_are_refused_by_name():
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        for override, message in [
            ("logger=tensorboard", r"logger must be null \(metrics.csv and TensorBoard only\) or one of wandb, got"),
            ("wandb.mode=sometimes", r"wandb.mode must be one of offline, online, got 'sometimes'"),
            ("wandb.project=", r"wandb.project must name a W&B project, got ''"),
        ]:
            with pytest.raises(ValueError, match=message):
                to_train_config(compose(config_name="config", overrides=[override]))


@pytest.mark.parametrize("module", ["robotrl.train", "robotrl.learner"])
def test_logger_wandb_without_the_package_names_the_extra_to_install(tmp_path, module):
    """As where the tracking extra is not installed: `import wandb` fails. The refusal is one line, at start-up."""
    code = f"import sys; sys.modules['wandb'] = None; sys.argv[0] = {module!r}; from {module} import main; main()"
    env = dict(os.environ, MUJOCO_GL="egl", HYDRA_FULL_ERROR="0")
    args = ["task=gym", "logger=wandb", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "logger=wandb needs the wandb package, which is not installed; install the tracking extra: " in output
    assert 'pip install -e ".[tracking]"' in output
    assert "Traceback" not in output, output
