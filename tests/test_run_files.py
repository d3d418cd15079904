"""A run directory's files when something is wrong: every program that loads the run's checkpoint refuses a
corrupt one naming the file, and a rewrite of config.yaml cut short leaves the old one."""

import shutil
import textwrap

import pytest
from helpers import TINY, run_module, run_with_file_size_limit

from robotrl.runtime.checkpoint import CheckpointError, latest_checkpoint


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    fixed = ("task", "total_steps", "learning_starts", "eval_interval", "checkpoint_interval")
    args = [a for a in TINY if not a.startswith(fixed)]
    args += ["total_steps=100", "learning_starts=50", "eval_interval=100", "checkpoint_interval=100", "video=false"]
    args += ["task=panda_reach"]  # an arm task: robotrl-deploy runs only those
    run_module("robotrl.train", *args, f"hydra.run.dir={run_dir}")
    return run_dir


@pytest.fixture
def run_dir(trained_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, symlinks=True)
    return copy


def _flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01
    path.write_bytes(bytes(data))


def _assert_one_line_naming(proc, *names):
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for name in names:
        assert name in proc.stderr, proc.stderr[-3000:]


def test_eval_refuses_a_bit_flipped_weights_file_naming_it(run_dir):
    weights = latest_checkpoint(run_dir / "checkpoints") / "agent.safetensors"
    _flip_a_bit(weights)
    proc = run_module("robotrl.eval", f"run={run_dir}", "episodes=1", "video=false", check=False, timeout=120)
    _assert_one_line_naming(proc, "robotrl-eval: error:", f"{weights}: checksum mismatch")


def test_eval_refuses_a_pointer_out_of_checkpoints(run_dir):
    (run_dir / "checkpoints" / "latest").write_text("../../elsewhere")
    proc = run_module("robotrl.eval", f"run={run_dir}", "episodes=1", "video=false", check=False, timeout=120)
    _assert_one_line_naming(proc, "robotrl-eval: error:", "names '../../elsewhere'")


def test_resume_refuses_a_corrupt_optimizer_file_naming_it(run_dir):
    optimizer = latest_checkpoint(run_dir / "checkpoints") / "optim_sac.safetensors"
    _flip_a_bit(optimizer)
    proc = run_module("robotrl.train", f"resume={run_dir}", "total_steps=200", check=False, timeout=120)
    _assert_one_line_naming(proc, "robotrl-train: error:", f"{optimizer}: checksum mismatch")


def test_deploy_refuses_to_load_a_corrupt_policy(run_dir):
    from robotrl.hardware.deploy import load_policy

    weights = latest_checkpoint(run_dir / "checkpoints") / "agent.safetensors"
    _flip_a_bit(weights)
    with pytest.raises(CheckpointError, match="checksum mismatch") as err:
        load_policy(run_dir)
    assert err.value.path == weights


RESUME = textwrap.dedent(
    """
    import sys
    from robotrl.train import main
    sys.argv = ["robotrl-train", *sys.argv[1:]]
    main()
    """
)


def test_a_config_rewrite_cut_short_on_resume_keeps_the_old_config(run_dir):
    """Resume rewrites config.yaml (a changed total_steps must hold for the next resume); a disk that fills up
    part-way through must leave the old file, not half of the new one."""
    config = run_dir / "config.yaml"
    before = config.read_bytes()
    proc = run_with_file_size_limit(
        len(before) // 2,
        RESUME,
        f"resume={run_dir}",
        "total_steps=200",
        "hydra.output_subdir=null",  # Hydra's own copies would hit the limit first
        "hydra/job_logging=disabled",
    )
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert config.read_bytes() == before, proc.stderr[-3000:]
    assert not list(run_dir.glob(".config.yaml*")), "a temporary file was left"


def test_a_run_saved_with_flat_encoder_settings_loads_them_nested(tmp_path, caplog):
    """Runs saved before the pixel encoder's settings moved under agent.encoder still evaluate and deploy."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from robotrl.config import register_configs
    from robotrl.runtime.run_config import load_run_config, save_run_config

    caplog.set_level("INFO")
    register_configs()
    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose("config", ["agent=drqv2_light", "task=panda_reach", "task.obs=pixels"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    encoder = saved["agent"].pop("encoder")
    saved["agent"].update({**encoder, "frame_stack": 2})  # the layout such runs wrote
    save_run_config(OmegaConf.create(saved), tmp_path)
    loaded = load_run_config(tmp_path)
    assert loaded.agent.encoder.frame_stack == 2 and loaded.agent.encoder.conv_layers == 2
    assert loaded.agent.frame_stack == 2 and "read as agent.encoder" in caplog.text
    saved["agent"]["conv_layerz"] = 3  # an unknown key still fails, naming it
    save_run_config(OmegaConf.create(saved), tmp_path)
    with pytest.raises(Exception, match="conv_layerz"):
        load_run_config(tmp_path)


def test_a_learner_saved_with_flat_encoder_settings_restarts_on_them(tmp_path):
    """A fine-tuning learner's run saved before the encoder settings were nested restarts; another agent does not."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from robotrl.learner import _check_same_experiment
    from robotrl.runtime.run_config import save_run_config

    with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
        cfg = compose("learner", ["task=panda_reach"])
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["agent"].update(saved["agent"].pop("encoder"))  # the layout such runs wrote
    save_run_config(OmegaConf.create(saved), tmp_path)
    _check_same_experiment(cfg, tmp_path / "config.yaml")
    saved["agent"]["gamma"] = 0.5
    save_run_config(OmegaConf.create(saved), tmp_path)
    with pytest.raises(ValueError, match="holds a learner for another agent"):
        _check_same_experiment(cfg, tmp_path / "config.yaml")


def test_metrics_of_a_run_killed_before_or_while_writing_them_resume(tmp_path):
    """A learner or train run killed before its first metrics row (an empty metrics.csv) or in the middle of
    one (a row cut short) resumes: the resumed writer keeps the whole rows up to its step and nothing else."""
    from robotrl.runtime.metrics import MetricsWriter, read_metrics

    (tmp_path / "metrics.csv").write_text("")
    MetricsWriter(tmp_path, resume_step=100).close()
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,key,value"]
    (tmp_path / "metrics.csv").write_text("step,key,value\n100,loss,1\n200,loss,2\n300,lo")
    writer = MetricsWriter(tmp_path, resume_step=200)
    writer.write(300, {"loss": 3.0})
    writer.close()
    assert read_metrics(tmp_path / "metrics.csv") == {"loss": [(100, 1.0), (200, 2.0), (300, 3.0)]}
