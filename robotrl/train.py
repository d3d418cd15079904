"""`robotrl-train`: Hydra entry point for training.

robotrl-train agent=sac task=gym task.env_id=HalfCheetah-v5 seed=1 total_steps=100000
robotrl-train -m seed=1,2,3                       # a sweep, one run directory each
robotrl-train resume=runs/.../<run> [total_steps=...]   # continue a run where it stopped
robotrl-train backend=genesis num_envs=64 task=panda_reach   # a built-in task on Genesis, 64 envs batched
robotrl-train backend=mujoco_warp num_envs=4096 task=panda_reach   # on MuJoCo Warp (a GPU), 4096 envs batched
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from robotrl.cli_errors import exits_on_error, reports_errors
from robotrl.config import apply_backend, register_configs, to_train_config, typed_train_config
from robotrl.runtime.loop import train
from robotrl.runtime.run_config import read_run_config, run_config_file, save_run_config
from robotrl.runtime.run_lock import hold_run_dir
from robotrl.tasks import write_deploy_spec_for_run

log = logging.getLogger(__name__)
register_configs()

# Keys whose change on resume would make the continued run a different experiment.
_FIXED_ON_RESUME = ("agent", "task", "seed", "num_envs", "replay_capacity", "backend")


def _resume_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The saved config of the run to resume, with this command line's scalar overrides applied."""
    run_dir = Path(cfg.resume)
    saved = typed_train_config(read_run_config(cfg.resume, key="resume"))
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key == "resume":
            continue
        if key.split(".")[0] in _FIXED_ON_RESUME:
            if key in ("agent", "task") and value == saved[key].name:
                continue
            if key == "backend" and value == saved.task.get("backend"):
                continue
            if key not in ("agent", "task", "backend") and _unchanged(saved, key, value):
                continue  # the original command line with resume= added
            raise ValueError(f"cannot change {key!r} when resuming {run_dir}; start a new run instead")
        saved.merge_with(OmegaConf.from_dotlist([f"{key}={value}"]))
    saved.resume = str(run_dir)
    return saved


def _unchanged(saved: DictConfig, key: str, value: str) -> bool:
    """Whether the override `key=value` gives `key` the value the saved config already has."""
    current = OmegaConf.select(saved, key, default=None)
    given = OmegaConf.from_dotlist([f"{key}={value}"])
    return current is not None and OmegaConf.select(given, key) == current


def run(cfg: DictConfig) -> dict[str, float]:
    if cfg.resume:
        cfg = _resume_config(cfg, list(HydraConfig.get().overrides.task))
        run_dir = Path(cfg.resume)
    else:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        apply_backend(cfg)  # the saved config's task.backend is the simulator the run used
    train_cfg = to_train_config(cfg)
    hold_run_dir(run_dir)  # a second process resuming this run would save over its checkpoints
    # on resume too: a setting changed there (total_steps) must hold for the next resume of the same run
    saved = cfg.copy()
    saved.resume = None
    save_run_config(saved, run_dir)
    # what a robot needs to run its policy
    write_deploy_spec_for_run(train_cfg.task, train_cfg.agent.frame_stack, run_dir)
    log.info("run directory: %s", run_dir.resolve())
    return train(train_cfg, run_dir, resume=bool(cfg.resume))


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="config")
@reports_errors("robotrl-train")
def _hydra_main(cfg: DictConfig) -> None:
    run(cfg)


def _route_resume_to_its_run_dir(argv: list[str]) -> list[str]:
    """`resume=DIR` continues in DIR, so Hydra's own output for this invocation goes there too. DIR is checked
    first: Hydra would create it, and a mistyped path would leave an empty run directory behind."""
    for arg in argv[1:]:
        if arg.startswith("resume=") and arg != "resume=null":
            run_dir = arg.split("=", 1)[1]
            run_config_file(run_dir, key="resume")
            return [*argv, f"hydra.run.dir={run_dir}"]
    return argv


def main() -> None:
    with exits_on_error("robotrl-train"):
        sys.argv = _route_resume_to_its_run_dir(sys.argv)
    _hydra_main()


if __name__ == "__main__":
    main()
