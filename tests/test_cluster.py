"""Sweeps through Hydra's submitit launcher (the cluster extra), run by submitit's local executor: the same launcher
as `hydra/launcher=submitit_slurm`, with processes on this machine instead of SLURM jobs (docs/cluster.md)."""

import pytest
from helpers import TINY, run_module

pytest.importorskip(
    "hydra_plugins.hydra_submitit_launcher",
    reason='hydra-submitit-launcher is not installed (pip install -e ".[cluster]")',
)


def test_a_two_seed_sweep_runs_as_two_submitit_jobs_each_in_its_own_run_dir(tmp_path):
    run_module(
        "robotrl.train",
        "-m",
        "seed=1,2",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        *[a for a in TINY if not a.startswith("total_steps")],
        "total_steps=250",
        "video=false",
        "threads=1",  # two jobs at once on two cores: OpenMP threads that wait spinning would slow both
        f"hydra.sweep.dir={tmp_path}",
    )
    runs = sorted(p.name for p in tmp_path.iterdir() if (p / "summary.json").exists())
    assert runs == ["0_gym_sac_s1", "1_gym_sac_s2"]
    jobs = sorted((tmp_path / ".submitit").glob("*/*_result.pkl"))  # what each submitit job returned
    assert len(jobs) == 2 and len({job.parent for job in jobs}) == 2, jobs
