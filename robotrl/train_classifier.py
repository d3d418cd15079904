"""`robotrl-train-classifier`: train a reward classifier on recorded episodes (robotrl/hil/reward_classifier.py).

robotrl-train-classifier datasets=[demos/pick_1,demos/pick_2] cameras=[front,wrist] out=classifiers/pick
robotrl-train-classifier datasets=[demos/pick] out=classifiers/pick epochs=20 min_precision=0.99

Episodes are split by episode into training and held-out (calibration) sets, plus an optional test set
(`test_fraction`) that neither training nor calibration sees: without one, the report's figures are
measured on the frames the threshold was picked on, an optimistic estimate. Labels are each dataset's recorded `success`
(the label of the frame after each step). Writes `out/model.safetensors`, `out/config.json` (the
classifier, with its threshold) and `out/report.json` (precision, recall, accuracy, threshold, counts),
and prints the report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from robotrl.cli_errors import reports_errors
from robotrl.config import strict_object
from robotrl.core.durable import write_atomic
from robotrl.data.dataset import Episode, EpisodeDataset
from robotrl.hil.reward_classifier import (
    ClassifierArchitecture,
    RewardClassifier,
    TrainSettings,
    binary_metrics,
    calibrate_threshold,
    check_split_fractions,
    frames_from_episodes,
    split_episodes,
    train_classifier,
)

log = logging.getLogger(__name__)


@dataclass
class TrainClassifierConfig:
    datasets: list[str] = MISSING  # dataset roots (robotrl.data.dataset.EpisodeDataset)
    out: str = MISSING  # output directory for the classifier and its report
    cameras: list[str] = field(default_factory=lambda: ["front"])
    frame_stack: int = 1
    # network (see ClassifierArchitecture)
    channels: int = 32
    layers: int = 4
    stride: int = 2
    feature_dim: int = 64
    hidden: list[int] = field(default_factory=lambda: [256])
    # training (see TrainSettings)
    epochs: float = 10.0
    batch_size: int = 128
    lr: float = 3e-4
    weight_decay: float = 1e-4
    shift_pad: int = 4
    # split and calibration
    held_out_fraction: float = 0.2  # episodes the threshold is calibrated on
    test_fraction: float = 0.0  # episodes kept out of training and calibration, for an unbiased report
    min_precision: float = 0.95
    seed: int = 0
    device: str = "cpu"  # cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default

    def validate(self) -> None:
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        self.architecture(image_size=64).validate()
        self.settings().validate()
        if not 0.0 < self.min_precision <= 1.0:
            raise ValueError(f"min_precision must be within (0, 1], got {self.min_precision}")
        check_split_fractions(self.held_out_fraction, self.test_fraction)  # before any loading

    def architecture(self, image_size: int) -> ClassifierArchitecture:
        return ClassifierArchitecture(
            cameras=tuple(self.cameras),
            image_size=image_size,
            frame_stack=self.frame_stack,
            channels=self.channels,
            layers=self.layers,
            stride=self.stride,
            feature_dim=self.feature_dim,
            hidden=tuple(self.hidden),
        )

    def settings(self) -> TrainSettings:
        return TrainSettings(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            weight_decay=self.weight_decay,
            shift_pad=self.shift_pad,
            seed=self.seed,
        )


def register_configs() -> None:
    ConfigStore.instance().store(name="train_classifier_schema", node=TrainClassifierConfig)


register_configs()


def train_and_calibrate(
    train: Sequence[Episode], held_out: Sequence[Episode], test: Sequence[Episode], cfg: TrainClassifierConfig
) -> tuple[RewardClassifier, dict[str, Any]]:
    """Train on `train` episodes, calibrate the threshold on `held_out`, measure on `test` (if any).
    Returns (classifier, report)."""
    train_frames, train_labels = frames_from_episodes(train, cfg.cameras, cfg.frame_stack)
    held_frames, held_labels = frames_from_episodes(held_out, cfg.cameras, cfg.frame_stack)
    image_size = next(iter(train_frames.values())).shape[-1]
    torch.manual_seed(cfg.seed)
    model = RewardClassifier(cfg.architecture(image_size)).to(cfg.device)
    log.info(
        "training on %d frames (%d success) from %d episodes; calibrating on %d frames from %d episodes",
        len(train_labels),
        int(train_labels.sum()),
        len(train),
        len(held_labels),
        len(held_out),
    )
    fit = train_classifier(
        model,
        train_frames,
        train_labels,
        cfg.settings(),
        on_epoch=lambda epoch, loss: log.info("epoch %d: loss %.4f", epoch, loss),
    )
    calibration = calibrate_threshold(model.probabilities(held_frames), held_labels, cfg.min_precision)
    model.threshold = calibration.threshold
    train_metrics = binary_metrics(model.predict(train_frames), train_labels)
    held_metrics = binary_metrics(model.predict(held_frames), held_labels)
    counts = {
        "episodes_train": len(train),
        "episodes_held_out": len(held_out),
        "episodes_test": len(test),
        "frames_train": len(train_labels),
        "frames_held_out": len(held_labels),
        "success_frames_train": int(train_labels.sum()),
        "success_frames_held_out": int(held_labels.sum()),
    }
    report: dict[str, Any] = {
        "threshold": calibration.threshold,
        "min_precision": calibration.min_precision,
        "met_min_precision": calibration.met_min_precision,
        "note": calibration.note,
        "held_out": held_metrics,
        "train_metrics": train_metrics,
    }
    evaluated = held_metrics
    if test:
        test_frames, test_labels = frames_from_episodes(test, cfg.cameras, cfg.frame_stack)
        evaluated = report["test"] = binary_metrics(model.predict(test_frames), test_labels)
        counts.update(frames_test=len(test_labels), success_frames_test=int(test_labels.sum()))
    report.update(
        evaluated_on="test" if test else "held_out",
        precision=evaluated["precision"],
        recall=evaluated["recall"],
        accuracy=evaluated["accuracy"],
        counts=counts,
        train=fit,
        cameras=list(cfg.cameras),
        image_size=image_size,
        frame_stack=cfg.frame_stack,
    )
    return model, report


def load_episodes(roots: Sequence[str]) -> list[Episode]:
    episodes = []
    seen: dict[Path, str] = {}
    for root in roots:
        if not Path(root).exists():
            raise FileNotFoundError(f"datasets: {root!r} does not exist")
        resolved = Path(root).resolve()
        if resolved in seen:  # its episodes would land in train and held-out both: figures measured on training data
            raise ValueError(f"datasets: {root!r} is {seen[resolved]!r} again; name each dataset once")
        seen[resolved] = root
        loaded = EpisodeDataset.open(root).load_all()
        if not loaded:
            raise ValueError(f"datasets: {root!r} holds no episodes")
        log.info("%s: %d episodes", root, len(loaded))
        episodes.extend(loaded)
    return episodes


def run(cfg: TrainClassifierConfig) -> dict[str, Any]:
    cfg.validate()
    if not cfg.datasets:
        raise ValueError("datasets must name at least one dataset root, got []")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    episodes = load_episodes(cfg.datasets)
    successful = sum(episode.success_any for episode in episodes)
    if successful < 2:
        raise ValueError(
            f"datasets: {successful} of {len(episodes)} episodes reach success; the classifier needs at least 2 "
            "(one to learn from, one to calibrate its threshold on): record more successful episodes"
        )
    train, held_out, test = split_episodes(episodes, cfg.held_out_fraction, cfg.test_fraction, cfg.seed)
    if test and not any(episode.success_any for episode in test):
        log.warning("no test episode reaches success: test recall is undefined; record more successful episodes")
    model, report = train_and_calibrate(train, held_out, test, cfg)
    report["datasets"] = list(cfg.datasets)
    out = Path(cfg.out)
    calibration = {k: report[k] for k in ("threshold", "min_precision", "met_min_precision", "note")}
    model.save(out, extra={"calibration": {**calibration, "held_out": report["held_out"]}, "training": asdict(cfg)})
    write_atomic(out / "report.json", json.dumps(report, indent=1).encode())
    return report


@hydra.main(version_base="1.3", config_path="pkg://robotrl.configs", config_name="train_classifier")
@reports_errors("robotrl-train-classifier")
def _hydra_main(cfg: DictConfig) -> None:
    report = run(strict_object(TrainClassifierConfig, cfg))
    print(json.dumps(report))


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
