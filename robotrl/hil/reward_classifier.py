"""A learned success classifier on camera frames: HIL-SERL's reward classifier.

A task's hand-written reward is replaced by "did this frame show the task done?". The classifier reads one
or more cameras (uint8 [3*k, H, W] each: `k` stacked frames, oldest first, as FrameStack stacks them),
runs one DrQ-style conv encoder per camera and a shared trunk (robotrl.nn.encoders.ImageStateEncoder),
then an MLP head to one logit. Training uses random shifts (robotrl.nn.augment) and class-balanced BCE:
success frames are rare in recorded episodes, and a classifier that always says "no" would otherwise look
good. The decision threshold is picked afterwards on held-out episodes (`calibrate_threshold`): a false
success is a reward for the wrong behaviour, so precision comes first.

Frames are dicts keyed like observations (`pixels_<camera>`), so an env's `next_obs` goes in unchanged.
Saved as `model.safetensors` + `config.json` (architecture, cameras, image size, threshold, the weights'
sha256); no pickle. Each file is written atomically, the config last, so a save cut short leaves the previous
classifier or weights its config's checksum refuses.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn

from robotrl.core.checksum import mismatch_problem, sha256_of_bytes
from robotrl.core.durable import write_atomic
from robotrl.core.spec import TensorSpec
from robotrl.nn.augment import random_shift
from robotrl.nn.encoders import ImageStateEncoder
from robotrl.nn.mlp import MLP

log = logging.getLogger(__name__)

FORMAT = "robotrl.reward_classifier"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
Frames = dict[str, torch.Tensor]


def camera_key(camera: str) -> str:
    """The observation entry holding a camera's frames."""
    return f"pixels_{camera}"


@dataclass(frozen=True)
class ClassifierArchitecture:
    """Everything needed to rebuild the network (saved in config.json)."""

    cameras: tuple[str, ...] = ("front",)
    image_size: int = 64
    frame_stack: int = 1  # frames per camera input, stacked on the channel axis
    channels: int = 32  # conv filters per layer
    layers: int = 4  # conv layers per camera
    stride: int = 2  # stride of the conv layers after the first (which always has 2)
    feature_dim: int = 64  # trunk width (Linear, LayerNorm, tanh)
    hidden: tuple[int, ...] = (256,)  # head MLP widths

    def __post_init__(self):
        # lists from JSON or Hydra become tuples, so two equal architectures compare equal
        object.__setattr__(self, "cameras", tuple(self.cameras))
        object.__setattr__(self, "hidden", tuple(self.hidden))

    def validate(self) -> None:
        if not self.cameras:
            raise ValueError("a reward classifier needs at least one camera, got cameras=[]")
        if len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"cameras must be distinct, got {list(self.cameras)}")
        for camera in self.cameras:
            if not isinstance(camera, str) or not camera:
                raise ValueError(f"camera names must be non-empty strings, got {camera!r}")
        for name in ("image_size", "frame_stack", "channels", "layers", "stride", "feature_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(width < 1 for width in self.hidden):
            raise ValueError(f"hidden widths must be >= 1, got {list(self.hidden)}")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3 * self.frame_stack, self.image_size, self.image_size)


class RewardClassifier(nn.Module):
    """Camera frames -> probability that the task is done. `predict` applies the calibrated threshold."""

    def __init__(self, architecture: ClassifierArchitecture, threshold: float = 0.5):
        super().__init__()
        architecture.validate()
        self.architecture = architecture
        self.keys = [camera_key(camera) for camera in architecture.cameras]
        spec = {key: TensorSpec(architecture.input_shape, torch.uint8) for key in self.keys}
        self.encoder = ImageStateEncoder(
            spec, architecture.feature_dim, architecture.channels, architecture.layers, architecture.stride
        )
        self.head = MLP(self.encoder.out_dim, architecture.hidden, 1)
        self.threshold = check_threshold(threshold)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def check_frames(self, frames: Mapping[str, torch.Tensor], where: str = "frames") -> int:
        """The batch size, or ValueError naming the camera entry whose shape or dtype is wrong."""
        if not isinstance(frames, Mapping):
            raise TypeError(f"{where}: expected a dict of camera frames {self.keys}, got {type(frames).__name__}")
        batch = None
        for key in self.keys:
            if key not in frames:
                raise KeyError(f"{where}: missing camera entry {key!r}; got {sorted(frames)}")
            value = frames[key]
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{where}[{key!r}]: expected a torch.Tensor, got {type(value).__name__}")
            if value.dtype != torch.uint8:
                raise ValueError(f"{where}[{key!r}]: expected uint8 images, got {value.dtype}")
            if value.dim() != 4 or tuple(value.shape[1:]) != self.architecture.input_shape:
                raise ValueError(
                    f"{where}[{key!r}]: expected shape [batch, {', '.join(map(str, self.architecture.input_shape))}]"
                    f", got {list(value.shape)}"
                )
            if batch is not None and value.shape[0] != batch:
                raise ValueError(f"{where}[{key!r}]: batch of {value.shape[0]} frames, other cameras have {batch}")
            batch = value.shape[0]
        return batch

    def forward(self, frames: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits [B] (float32). Frames must already be on the classifier's device."""
        return self.head(self.encoder({key: frames[key] for key in self.keys})).squeeze(-1)

    def probabilities(self, frames: Mapping[str, torch.Tensor], batch_size: int = 512) -> torch.Tensor:
        """Success probabilities [B] on the CPU, evaluated in batches without autograd."""
        total = self.check_frames(frames)
        was_training = self.training
        self.eval()
        out = []
        with torch.inference_mode():
            for start in range(0, total, batch_size):
                batch = {key: frames[key][start : start + batch_size].to(self.device) for key in self.keys}
                out.append(torch.sigmoid(self(batch)).float().cpu())
        self.train(was_training)
        return torch.cat(out) if out else torch.zeros(0)

    def predict(self, frames: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Success [B] bool at the calibrated threshold."""
        return self.probabilities(frames) >= self.threshold

    def save(self, path: str | Path, extra: Mapping[str, Any] | None = None) -> Path:
        """Write `path/model.safetensors` and `path/config.json`; `extra` (e.g. the calibration) goes in the JSON."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.detach().cpu().contiguous() for name, tensor in self.state_dict().items()}
        weights = save_tensors(state)
        write_atomic(path / WEIGHTS_FILE, weights)
        config = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "architecture": asdict(self.architecture),
            "cameras": list(self.architecture.cameras),
            "image_size": self.architecture.image_size,
            "frame_stack": self.architecture.frame_stack,
            "threshold": self.threshold,
            **(dict(extra) if extra else {}),
            "weights_sha256": sha256_of_bytes(weights),
        }
        write_atomic(path / CONFIG_FILE, json.dumps(config, indent=1).encode())
        return path

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> RewardClassifier:
        """A classifier saved by `save`; fails naming the file that is missing or not a classifier."""
        path = Path(path)
        config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
        for required in (config_path, weights_path):
            if not required.is_file():
                raise FileNotFoundError(f"reward classifier {str(path)!r}: {required} does not exist")
        try:
            config = json.loads(config_path.read_bytes())
        except ValueError as error:
            raise ValueError(f"{config_path} is not valid JSON: {error}") from None
        if not isinstance(config, dict) or config.get("format") != FORMAT:
            raise ValueError(f"{config_path} is not a reward classifier config (format {FORMAT!r})")
        if config.get("version") != FORMAT_VERSION:
            raise ValueError(f"{config_path}: version {config.get('version')!r}, this code reads {FORMAT_VERSION}")
        try:
            architecture = ClassifierArchitecture(**config["architecture"])
        except TypeError as error:
            raise ValueError(f"{config_path}: bad architecture {config['architecture']!r}: {error}") from error
        model = cls(architecture, threshold=config["threshold"])
        model.load_state_dict(_read_weights(weights_path, config.get("weights_sha256")))
        return model.to(device).eval()


def _read_weights(path: Path, expected_sha256: str | None) -> dict[str, torch.Tensor]:
    """The tensors of `path`, checked against the config's sha256 where it records one (configs saved before
    it did load unchecked)."""
    data = path.read_bytes()
    if expected_sha256 is not None and (digest := sha256_of_bytes(data)) != expected_sha256:
        raise ValueError(f"{path}: {mismatch_problem(digest, expected_sha256, CONFIG_FILE)}")
    try:
        return load_tensors(data)
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None


def check_threshold(threshold: float) -> float:
    if not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be a probability in [0, 1], got {threshold!r}")
    return float(threshold)


# ---------------------------------------------------------------------------------------------------- data


def frames_from_episodes(
    episodes: Sequence[Any], cameras: Sequence[str], frame_stack: int = 1
) -> tuple[Frames, torch.Tensor]:
    """Every observation frame of every episode with its success label: (frames {pixels_<camera>: uint8
    [N, 3*frame_stack, H, W]}, labels [N] bool).

    An episode (robotrl.data.dataset.Episode or anything with the same fields) holds `obs[pixels_<camera>]`
    [T+1, 3, H, W] and `success` [T], the task's success after step t, i.e. the label of obs[t+1]. obs[0],
    the reset frame, is kept and labelled not-success: no task starts solved, and the classifier meets a
    reset frame in every episode it scores. Stacks repeat an episode's first frame, as FrameStack does.
    """
    if frame_stack < 1:
        raise ValueError(f"frame_stack must be >= 1, got {frame_stack}")
    if not cameras:
        raise ValueError("frames_from_episodes needs at least one camera, got cameras=[]")
    if not episodes:
        raise ValueError("frames_from_episodes got no episodes")
    keys = [camera_key(camera) for camera in cameras]
    per_key: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
    labels = []
    for index, episode in enumerate(episodes):
        success = torch.as_tensor(episode.success).to(torch.bool).flatten()
        steps = len(success)
        for key in keys:
            if key not in episode.obs:
                raise KeyError(f"episode {index}: no camera entry {key!r}; it has {sorted(episode.obs)}")
            images = episode.obs[key]
            if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
                raise ValueError(
                    f"episode {index}: obs[{key!r}] must be uint8 [T+1, 3, H, W], got {images.dtype} "
                    f"{list(images.shape)}"
                )
            if per_key[key] and images.shape[2:] != per_key[key][0].shape[2:]:
                raise ValueError(
                    f"episode {index}: obs[{key!r}] frames are {list(images.shape[2:])}, earlier episodes' "
                    f"{list(per_key[key][0].shape[2:])}; all episodes must share one image size"
                )
            if images.shape[0] != steps + 1:
                raise ValueError(
                    f"episode {index}: obs[{key!r}] has {images.shape[0]} frames for {steps} steps (expected T+1)"
                )
            per_key[key].append(stack_episode_frames(images, frame_stack))
        labels.append(torch.cat([torch.zeros(1, dtype=torch.bool), success]))
    frames = {key: torch.cat(chunks) for key, chunks in per_key.items()}
    return frames, torch.cat(labels)


def stack_episode_frames(images: torch.Tensor, k: int) -> torch.Tensor:
    """[T+1, C, H, W] -> [T+1, k*C, H, W]: each frame with its k-1 predecessors, oldest first, the first
    frame repeated before the episode's start."""
    if k == 1:
        return images
    steps = images.shape[0]
    index = (torch.arange(steps).unsqueeze(1) + torch.arange(-k + 1, 1)).clamp_(min=0)  # [T+1, k]
    return images[index.flatten()].reshape(steps, k * images.shape[1], *images.shape[2:])


def check_split_fractions(held_out_fraction: float, test_fraction: float = 0.0) -> None:
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be within (0, 1), got {held_out_fraction}")
    if not 0.0 <= test_fraction < 1.0 or held_out_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"test_fraction must be >= 0 and leave episodes to train on: held_out_fraction {held_out_fraction} "
            f"+ test_fraction {test_fraction} must be < 1"
        )


def split_episodes(
    episodes: Sequence[Any], held_out_fraction: float, test_fraction: float = 0.0, seed: int = 0
) -> tuple[list[Any], list[Any], list[Any]]:
    """(train, held_out, test) by whole episodes: adjacent frames are near-duplicates, so a split by frame
    would leak. held_out (for calibration) gets at least one episode, test (unseen by training and
    calibration) at least one if `test_fraction` > 0, train the rest (at least one).

    Stratified by whether an episode reaches success, the rare class in real recordings: each part gets its
    share of the successful episodes, and held_out, then train, then test at least one while there are
    enough (calibration needs success frames, training both classes, test figures need positives)."""
    check_split_fractions(held_out_fraction, test_fraction)
    needed = 3 if test_fraction > 0 else 2
    if len(episodes) < needed:
        raise ValueError(f"this split needs at least {needed} episodes, got {len(episodes)}")
    n_test = max(1, round(test_fraction * len(episodes))) if test_fraction > 0 else 0
    n_held = min(max(1, round(held_out_fraction * len(episodes))), len(episodes) - n_test - 1)
    sizes = {"held_out": n_held, "train": len(episodes) - n_test - n_held, "test": n_test}
    rng = random.Random(seed)
    successful = [i for i, episode in enumerate(episodes) if bool(torch.as_tensor(episode.success).any())]
    failed = sorted(set(range(len(episodes))) - set(successful))
    rng.shuffle(successful)
    rng.shuffle(failed)
    parts: dict[str, list[int]] = {}
    for part, quota in _success_quotas(len(successful), sizes).items():
        parts[part] = successful[:quota] + failed[: sizes[part] - quota]
        del successful[:quota], failed[: sizes[part] - quota]
    train, held_out, test = ([episodes[i] for i in sorted(parts[name])] for name in ("train", "held_out", "test"))
    return train, held_out, test


def _success_quotas(successes: int, sizes: dict[str, int]) -> dict[str, int]:
    """Successful episodes per part: proportional to the parts' sizes (largest remainder), then moved one
    at a time to a part that has none, in the order of `sizes`, from a part that has more than one."""
    total = sum(sizes.values())
    exact = {part: successes * size / total for part, size in sizes.items()}
    quotas = {part: math.floor(value) for part, value in exact.items()}
    by_remainder = sorted(sizes, key=lambda part: exact[part] - quotas[part], reverse=True)
    for part in by_remainder[: successes - sum(quotas.values())]:
        quotas[part] += 1
    for part, size in sizes.items():
        donors = [other for other in quotas if quotas[other] > 1]
        if size and not quotas[part] and donors:
            quotas[max(donors, key=quotas.get)] -= 1
            quotas[part] += 1
    return quotas


# ------------------------------------------------------------------------------------------------ training


@dataclass
class TrainSettings:
    epochs: float = 10.0  # passes over the training frames (fractions allowed)
    batch_size: int = 128
    lr: float = 3e-4
    weight_decay: float = 1e-4
    shift_pad: int = 4  # random-shift augmentation, pixels
    seed: int = 0

    def validate(self) -> None:
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.shift_pad < 0:
            raise ValueError(f"shift_pad must be >= 0, got {self.shift_pad}")


def check_labels(labels: torch.Tensor, count: int, where: str = "labels") -> torch.Tensor:
    """Labels as a bool [count] tensor; 0/1 numbers are accepted, anything else fails naming `where`."""
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"{where}: expected a torch.Tensor, got {type(labels).__name__}")
    if labels.dim() != 1 or labels.shape[0] != count:
        raise ValueError(f"{where}: expected shape [{count}], got {list(labels.shape)}")
    if labels.dtype != torch.bool:
        if not ((labels == 0) | (labels == 1)).all():
            raise ValueError(f"{where}: labels must be 0/1 or bool, got values {labels.unique().tolist()[:8]}")
        labels = labels.to(torch.bool)
    return labels


def train_classifier(
    model: RewardClassifier,
    frames: Mapping[str, torch.Tensor],
    labels: torch.Tensor,
    settings: TrainSettings | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> dict[str, float]:
    """Fit `model` on (frames, labels) in place; returns {steps, loss, pos_weight, train_s}.

    Each class carries half of the loss whatever its share of the frames (weights N/(2*n_class)). Every
    batch is augmented with its own random shifts (uint8, before conversion). `on_epoch(epoch, mean_loss)`
    is called after each full pass, for progress logs.
    """
    settings = settings or TrainSettings()
    settings.validate()
    total = model.check_frames(frames, "training frames")
    labels = check_labels(labels, total, "training labels")
    positives = int(labels.sum())
    if positives == 0 or positives == total:
        raise ValueError(
            f"training labels need both classes; got {positives} success and {total - positives} other frames"
        )
    weight_pos, weight_neg = total / (2 * positives), total / (2 * (total - positives))
    device = model.device
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    steps_per_epoch = math.ceil(total / settings.batch_size)
    steps = max(1, math.ceil(settings.epochs * steps_per_epoch))
    targets = labels.float()
    model.train()
    start = time.perf_counter()
    order = torch.randperm(total, generator=generator)
    position, epoch_loss, epoch_batches, last_loss = 0, 0.0, 0, float("nan")
    for step in range(steps):
        if position + settings.batch_size > total and position > 0:
            order, position = torch.randperm(total, generator=generator), 0
        index = order[position : position + settings.batch_size]
        position += settings.batch_size
        batch = {key: random_shift(frames[key][index], settings.shift_pad, generator).to(device) for key in model.keys}
        target = targets[index].to(device)
        weight = torch.where(target > 0.5, weight_pos, weight_neg)
        loss = F.binary_cross_entropy_with_logits(model(batch), target, weight=weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        epoch_loss += loss.detach()
        epoch_batches += 1
        if (step + 1) % steps_per_epoch == 0 or step + 1 == steps:
            last_loss = float(epoch_loss) / epoch_batches
            if not math.isfinite(last_loss):
                raise FloatingPointError(f"reward classifier training diverged: loss {last_loss} at step {step + 1}")
            if on_epoch is not None:
                on_epoch(math.ceil((step + 1) / steps_per_epoch), last_loss)
            epoch_loss, epoch_batches = 0.0, 0
    model.eval()
    return {
        "steps": steps,
        "loss": last_loss,
        "pos_weight": weight_pos / weight_neg,
        "train_s": time.perf_counter() - start,
    }


# ------------------------------------------------------------------------------------- threshold, metrics


def binary_metrics(predicted: torch.Tensor, labels: torch.Tensor) -> dict[str, float | None]:
    """precision, recall, accuracy and the confusion counts. Precision is None (undefined) when nothing is
    predicted positive, recall None when there are no positives: a split without success frames says
    nothing about recall, and reporting 0 would call a classifier that made no mistake useless."""
    predicted, labels = predicted.to(torch.bool), labels.to(torch.bool)
    tp = int((predicted & labels).sum())
    fp = int((predicted & ~labels).sum())
    fn = int((~predicted & labels).sum())
    tn = int((~predicted & ~labels).sum())
    total = tp + fp + fn + tn
    return {
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / (tp + fn) if tp + fn else None,
        "accuracy": (tp + tn) / total if total else 0.0,
        "tp": tp,
        "fp": fp,
        "tn": tn,
        "fn": fn,
    }


@dataclass
class ThresholdCalibration:
    threshold: float
    precision: float
    recall: float
    accuracy: float
    min_precision: float
    met_min_precision: bool
    note: str = ""
    counts: dict[str, int] = field(default_factory=dict)


def calibrate_threshold(probs: torch.Tensor, labels: torch.Tensor, min_precision: float = 0.95) -> ThresholdCalibration:
    """The decision threshold (success iff prob >= threshold) with the highest recall whose precision on
    these held-out frames is at least `min_precision`; among equal recalls, the highest precision. If no
    threshold reaches `min_precision`, the one with the best F1, with `met_min_precision=False` and a note
    (also logged as a warning).

    The threshold is placed halfway between the lowest probability it accepts and the next lower one, not
    on a held-out value itself, so frames slightly less confident than the held-out ones still count.
    """
    if not 0.0 < min_precision <= 1.0:
        raise ValueError(f"min_precision must be within (0, 1], got {min_precision}")
    if not isinstance(probs, torch.Tensor) or probs.dim() != 1 or probs.numel() == 0:
        shape = list(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise ValueError(f"probs must be a non-empty 1-D tensor, got {shape}")
    probs = probs.detach().double().cpu()
    if not torch.isfinite(probs).all() or probs.min() < 0 or probs.max() > 1:
        raise ValueError(f"probs must be probabilities in [0, 1], got values in [{probs.min()}, {probs.max()}]")
    labels = check_labels(labels.detach().cpu(), probs.numel())
    positives = int(labels.sum())
    if positives == 0:
        raise ValueError(f"calibration needs success frames among the held-out ones; all {len(labels)} are failures")

    order = torch.argsort(probs, descending=True)
    sorted_probs, sorted_labels = probs[order], labels[order]
    tp = torch.cumsum(sorted_labels.double(), 0)
    fp = torch.cumsum((~sorted_labels).double(), 0)
    # a threshold can only sit between distinct values: keep the last index of each run of equal probs
    last_of_value = torch.ones_like(sorted_labels)
    last_of_value[:-1] = sorted_probs[:-1] != sorted_probs[1:]
    candidates = last_of_value.nonzero().flatten()
    precision, recall = (tp / (tp + fp))[candidates], (tp / positives)[candidates]

    meets = precision >= min_precision - 1e-12
    if meets.any():
        # highest recall first, then highest precision (for equal recall, the stricter threshold)
        best_recall = recall[meets].max()
        tied = meets & (recall == best_recall)
        pick = int(torch.argmax(torch.where(tied, precision, torch.full_like(precision, -1.0))))
        note = ""
    else:
        f1 = 2 * precision * recall / (precision + recall).clamp_min(1e-12)
        pick = int(torch.argmax(f1))
        note = (
            f"no threshold reaches precision {min_precision} on the {len(labels)} held-out frames "
            f"(best {float(precision.max()):.3f}); picked the best F1 ({float(f1[pick]):.3f}) instead"
        )
        log.warning("reward classifier calibration: %s", note)
    index = int(candidates[pick])
    lowest_accepted = float(sorted_probs[index])
    next_lower = float(sorted_probs[index + 1]) if index + 1 < len(sorted_probs) else 0.0
    threshold = (lowest_accepted + next_lower) / 2 if next_lower < lowest_accepted else lowest_accepted
    metrics = binary_metrics(probs >= threshold, labels)
    return ThresholdCalibration(
        threshold=threshold,
        precision=metrics["precision"],
        recall=metrics["recall"],
        accuracy=metrics["accuracy"],
        min_precision=min_precision,
        met_min_precision=bool(meets.any()),
        note=note,
        counts={name: metrics[name] for name in ("tp", "fp", "tn", "fn")},
    )
