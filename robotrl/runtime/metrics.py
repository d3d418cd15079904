"""Metric accumulation without device syncs, and writers for CSV, TensorBoard and an experiment tracker."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path

import torch

from robotrl.core.durable import write_atomic
from robotrl.runtime.tracking import WandbTracker


class NonFiniteError(FloatingPointError):
    """A loss or statistic became NaN or infinite; the run stops before any checkpoint can take it."""


class UpdateMetrics:
    """Sums 0-dim metric tensors across updates; `flush` turns them into floats once per log period."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0

    def add(self, metrics: Mapping[str, torch.Tensor]) -> None:
        for key, value in metrics.items():
            if key in self._sums:
                self._sums[key] += value
            else:
                self._sums[key] = value.detach().clone().float()
        self._count += 1

    def flush(self, step: int) -> dict[str, float]:
        """Means since the last flush; raises NonFiniteError naming the first non-finite metric."""
        if not self._count:
            return {}
        means = {key: float(total) / self._count for key, total in self._sums.items()}
        self._sums.clear()
        self._count = 0
        for key, value in means.items():
            if not math.isfinite(value):
                raise NonFiniteError(f"{key} became {value} by env step {step}")
        return means


HEADER = ["step", "key", "value"]


class MetricsWriter:
    """Appends scalars to metrics.csv (long format: step,key,value) and TensorBoard event files, and hands them,
    with the media the run writes, to `tracker` where the run has one (`logger`, robotrl/runtime/tracking.py)."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, tracker: WandbTracker | None = None):
        self._tracker = tracker
        self.csv_path = run_dir / "metrics.csv"
        if resume_step is not None and self.csv_path.exists():
            _truncate_after(self.csv_path, resume_step)
        new_file = not self.csv_path.exists()
        self._csv_file = self.csv_path.open("a", newline="")
        self._csv = csv.writer(self._csv_file)
        if new_file:
            self._csv.writerow(HEADER)
            self._csv_file.flush()  # a run killed before its first row still leaves a file with its header
        from torch.utils.tensorboard import SummaryWriter

        # events after the checkpoint's step are dropped, as from the CSV; those at it were written before it
        self._tb = SummaryWriter(str(run_dir / "tb"), purge_step=None if resume_step is None else resume_step + 1)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self._csv.writerow([step, key, f"{value:.6g}"])
            self._tb.add_scalar(key, value, step)
        self._csv_file.flush()
        if self._tracker is not None:
            self._tracker.log(step, scalars)

    def write_files(self, step: int, files: Mapping[str, Path | None]) -> None:
        """Media the run wrote into its directory (an evaluation video, the learning curve), for the tracker; a
        None or a file not written (no video asked for, no curve yet) is skipped."""
        written = {key: path for key, path in files.items() if path is not None and path.exists()}
        if self._tracker is not None and written:
            self._tracker.log_files(step, written)

    def close(self) -> None:
        self._csv_file.close()
        self._tb.close()
        if self._tracker is not None:
            self._tracker.close()


def _truncate_after(path: Path, step: int) -> None:
    """Drop rows logged after `step` (written by a run that died after its last checkpoint), and what a kill
    left unfinished: a row cut short, or a file without even its header."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    whole = [r for r in rows[1:] if len(r) == len(HEADER) and r[0].isdigit()]
    kept = [HEADER] + [r for r in whole if int(r[0]) <= step]
    text = io.StringIO(newline="")
    csv.writer(text).writerows(kept)
    write_atomic(path, text.getvalue().encode())


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.csv as {key: [(step, value), ...]}."""
    series: dict[str, list[tuple[int, float]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            series.setdefault(row["key"], []).append((int(row["step"]), float(row["value"])))
    return series
