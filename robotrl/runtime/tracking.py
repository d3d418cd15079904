"""Experiment tracking beside metrics.csv and TensorBoard, which every run writes: Weights & Biases with
`logger=wandb` (settings under `wandb.*`, robotrl/config.py: WandbConfig).

A tracked run gets the resolved config, every scalar the run logs, and the media it writes (evaluation videos, the
learning curve). Its W&B run id is kept in `<run dir>/wandb_run_id`, so a resumed run (or a restarted learner) goes
on as the same W&B run. Scalars are logged against `env_step`, not W&B's own step counter, which must only grow:
a resumed run logs again the env steps its killed predecessor logged after its last checkpoint.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from robotrl.config import WandbConfig, check_logger
from robotrl.core.durable import write_atomic

INSTALL_HINT = 'the tracking extra: pip install -e ".[tracking]"'
RUN_ID_FILE = "wandb_run_id"
STEP_KEY = "env_step"


class MissingExtraError(ImportError):
    """A setting needs a package of an optional extra that is not installed."""


def import_wandb() -> Any:
    try:
        import wandb  # the tracking extra, imported only by a run that logs to W&B
    except ImportError as err:
        raise MissingExtraError(
            f"logger=wandb needs the wandb package, which is not installed; install {INSTALL_HINT}"
        ) from err
    return wandb


def check_tracker(logger: str | None) -> None:
    """Fails at start-up, naming the extra to install, where `logger` needs a package that is missing."""
    check_logger(logger)
    if logger == "wandb":
        import_wandb()


class WandbTracker:
    """One W&B run: scalars and media of a robotrl run, against its env steps."""

    def __init__(self, settings: WandbConfig, run_dir: Path, config: Mapping[str, Any]):
        settings.validate()
        wandb = import_wandb()
        self._wandb = wandb
        id_file = run_dir / RUN_ID_FILE
        if id_file.exists():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(6)  # W&B ids: letters and digits, unique in a project
            write_atomic(id_file, f"{run_id}\n".encode())  # before the run exists: a resume always finds it
        self._run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            group=settings.group,
            tags=list(settings.tags) or None,
            mode=settings.mode,
            name=run_dir.name,
            id=run_id,
            resume="allow",
            config=dict(config),
            dir=None if os.environ.get("WANDB_DIR") else str(run_dir),  # W&B's own variable wins
            reinit="create_new",  # a second run in one process is a run of its own, not the first one continued
        )
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)

    @property
    def run_id(self) -> str:
        return self._run.id

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if scalars:
            self._run.log({**scalars, STEP_KEY: step})

    def log_files(self, step: int, files: Mapping[str, Path]) -> None:
        """Media the run wrote to its directory: .mp4 as a video, .png as an image."""
        media = {}
        for key, path in files.items():
            if path.suffix == ".mp4":
                media[key] = self._wandb.Video(str(path), format="mp4")
            elif path.suffix == ".png":
                media[key] = self._wandb.Image(str(path))
            else:
                raise ValueError(f"{key}: {path} is neither an .mp4 video nor a .png image")
        if media:
            self._run.log({**media, STEP_KEY: step})

    def close(self) -> None:
        self._run.finish()


def open_tracker(
    logger: str | None, settings: WandbConfig, run_dir: Path, config: Mapping[str, Any]
) -> WandbTracker | None:
    """The tracker `logger` names, logging to the run in `run_dir` (resumed where it holds one); None for null."""
    check_logger(logger)
    if logger is None:
        return None
    return WandbTracker(settings, run_dir, config)
