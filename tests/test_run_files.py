"""A run directory's files when something is wrong: a rewrite of config.yaml cut short leaves the old one."""

import shutil
import textwrap

import pytest
from helpers import TINY, run_module, run_with_file_size_limit


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    fixed = ("total_steps", "learning_starts", "eval_interval", "checkpoint_interval")
    args = [a for a in TINY if not a.startswith(fixed)]
    args += ["total_steps=100", "learning_starts=50", "eval_interval=100", "checkpoint_interval=100", "video=false"]
    run_module("robotrl.train", *args, f"hydra.run.dir={run_dir}")
    return run_dir


@pytest.fixture
def run_dir(trained_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, symlinks=True)
    return copy


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
