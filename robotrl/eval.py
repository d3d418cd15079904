"""`robotrl-eval run=<run dir> episodes=N [backend=genesis]`: evaluate a run's latest checkpoint.

`backend=` evaluates on another simulator than the run trained on (a policy trained on MuJoCo, evaluated
on Genesis, or the reverse): the run's saved config still gives the task, only the backend changes.
`randomization=`, `actuation.*` and `sensing.*` evaluate under changed physics, actuators or sensors (a preset's
draws, or one fixed corner: docs/sim2real.md).

Prints mean return (and success rate where the task defines success) and writes a video of the first
episode under <run dir>/eval/<time>/.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from robotrl.agents import make_agent
from robotrl.cli_errors import exits_on_error, reports_errors
from robotrl.config import EvalConfig, register_configs, strict_object
from robotrl.core.durable import write_atomic
from robotrl.runtime.assembly import (
    add_actuation,
    add_randomization,
    add_sensing,
    make_training_env,
    privileged_entry,
    resolve_device,
)
from robotrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
from robotrl.runtime.evaluate import evaluate
from robotrl.runtime.run_config import load_run_config, run_config_file

log = logging.getLogger(__name__)
register_configs()


def run(cfg: EvalConfig, out_dir: Path) -> dict[str, float]:
    cfg.validate()
    run_dir = Path(cfg.run)
    train_cfg = load_run_config(run_dir, cfg.backend)  # robotrl-train's run, or robotrl-learner's
    env = make_training_env(train_cfg, num_envs=1, render=cfg.video)
    add_randomization(env, cfg.randomization, cfg.seed, out_dir / "randomization.jsonl")
    add_actuation(env, cfg.actuation, cfg.seed)
    env = add_sensing(env, cfg.sensing, cfg.seed)
    spec = {**env.obs_spec, **privileged_entry(run_dir)}  # the trained critic's input, for its weights to load
    agent = make_agent(train_cfg.agent, spec, env.action_dim, resolve_device(cfg.device))
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    load_checkpoint(ckpt, agent, replay=None, restore_rng=False)
    agent.eval()
    result = evaluate(
        agent,
        env,
        cfg.episodes,
        seed=cfg.seed,
        video_path=out_dir / "eval.mp4" if cfg.video else None,
        deterministic=cfg.deterministic,
    )
    env.close()
    backend = getattr(train_cfg.task, "backend", None)
    modelled = {"randomization": cfg.randomization.name} if cfg.randomization.terms else {}
    result = {
        "checkpoint": ckpt.name,
        "episodes": cfg.episodes,
        **({"backend": backend} if backend else {}),
        **modelled,
        **result,
    }
    write_atomic(out_dir / "eval.json", json.dumps(result, indent=1).encode())
    return result


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="eval")
@reports_errors("robotrl-eval")
def _hydra_main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    result = run(strict_object(EvalConfig, cfg), out_dir)
    print(json.dumps(result))


def _check_run_before_hydra(argv: list[str]) -> None:
    """Hydra creates its output directory, `<run>/eval/<time>/`, before the task starts: a `run=` that is not a
    run directory must fail first, or a mistyped path would be left behind as an empty directory tree."""
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "run":
            run_config_file(value)


def main() -> None:
    with exits_on_error("robotrl-eval"):
        _check_run_before_hydra(sys.argv)
    _hydra_main()


if __name__ == "__main__":
    main()
