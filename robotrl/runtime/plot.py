"""Learning-curve figure from metrics.csv."""

from __future__ import annotations

from pathlib import Path

from robotrl.runtime.metrics import read_metrics


def plot_learning_curve(metrics_csv: Path, out_png: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(metrics_csv)
    panels = [("train/episode_return", "eval/return"), ("train/success", "eval/success")]
    panels = [p for p in panels if any(k in series for k in p)]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, keys in zip(axes[0], panels, strict=True):
        for key in keys:
            if key in series:
                steps, values = zip(*series[key], strict=True)
                ax.plot(steps, values, label=key, marker="o" if key.startswith("eval") else None)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
