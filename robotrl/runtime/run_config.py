"""A run directory's config.yaml: written atomically when a run starts, read back by resume, evaluation and
deployment as the typed config of whichever program wrote it (robotrl-train's or robotrl-learner's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from robotrl.agents.config import nest_encoder_keys
from robotrl.config import to_train_config
from robotrl.core.durable import write_atomic
from robotrl.runtime.learner_config import to_learner_config

# A run's copy of its task.model_overlay: the saved config names it, so that resuming, evaluating or exporting the
# run meets the dynamics it trained on even after the original file is edited, moved or deleted.
PINNED_OVERLAY = "model_overlay.yaml"


def save_run_config(cfg: DictConfig, run_dir: Path) -> None:
    """Write `run_dir/config.yaml`, resolved, atomically: it is rewritten on resume, and a half-written one would
    leave a run that can be neither resumed, evaluated nor deployed. A model overlay is copied into the run
    (`PINNED_OVERLAY`) and the saved config names the copy."""
    run_dir = Path(run_dir)
    cfg = _pin_overlay(cfg, run_dir)
    write_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True).encode("utf-8"))


def _pin_overlay(cfg: DictConfig, run_dir: Path) -> DictConfig:
    task = cfg.get("task")
    source = task.get("model_overlay") if isinstance(task, DictConfig) else None
    if not source:
        return cfg
    pinned = run_dir / PINNED_OVERLAY
    if not Path(source).is_file():
        raise FileNotFoundError(f"task.model_overlay={source!r}: no such file")
    if Path(source).resolve() != pinned.resolve():
        write_atomic(pinned, Path(source).read_bytes())
    cfg = cfg.copy()
    cfg.task.model_overlay = PINNED_OVERLAY
    return cfg


def run_config_file(run: str | Path, key: str = "run") -> Path:
    """The config.yaml run directory `run` saved; FileNotFoundError naming `key=run` and what is missing."""
    path = Path(run) / "config.yaml"
    if not path.is_file():
        missing = path if Path(run).exists() else Path(run)
        raise FileNotFoundError(f"{key}={str(run)!r}: {missing} does not exist (not a robotrl run directory?)")
    return path


def read_run_config(run: str | Path, key: str = "run") -> DictConfig:
    """The config.yaml run directory `run` saved, untyped, in today's layout: settings that runs saved before a
    schema moved them are moved too (agents/config.py: nest_encoder_keys)."""
    path = run_config_file(run, key)
    saved = OmegaConf.load(path)
    if isinstance(saved.get("agent"), DictConfig):
        saved.agent = nest_encoder_keys(OmegaConf.to_container(saved.agent), str(path))
    task = saved.get("task")
    if isinstance(task, DictConfig) and task.get("model_overlay") == PINNED_OVERLAY:
        task.model_overlay = str(Path(run) / PINNED_OVERLAY)  # the run's own copy, wherever the run now lies
    return saved


def load_run_config(run: str | Path, backend: str | None = None) -> Any:
    """The typed config a run directory saved (its config.yaml): robotrl-train's TrainConfig, or robotrl-learner's
    LearnerConfig (the policy of a fine-tuning session). Both carry the `agent` and `task` that evaluation and
    deployment rebuild the policy from; `backend` replaces the saved simulator."""
    saved = read_run_config(run)
    if backend is not None:  # the top-level key wins over the saved task.backend
        saved.backend = backend
    if "learner" in saved and "agent" not in saved:  # robotrl-actor's: the learner holds the policy
        raise ValueError(
            f"run={str(run)!r} is a robotrl-actor's directory, which holds no policy: give the learner's run directory"
        )
    if "server" in saved:  # only robotrl-learner's schema has one
        return to_learner_config(saved)
    return to_train_config(saved)
