"""The run report's figures: PNGs drawn with matplotlib, and the figures other stages drew, copied into the report's
``figures/``. A PNG's only metadata is matplotlib's version (no date), so a rebuilt report's figures are the same
files."""

from __future__ import annotations

import shutil
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def planner_accuracy(summary: dict, png: Path) -> None:
    """The planner's next-action top-1 accuracy per horizon step beside its baselines' (``summary``: a planner's
    summary.json, ``planlm.pipeline.results.planner_summaries``)."""
    plt = _pyplot()
    metrics = summary["metrics"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    steps = list(range(1, summary["horizon"] + 1))
    for n in metrics:
        if metrics[n].get("top1") is not None:
            ax.plot(steps, metrics[n]["top1"], marker="o", label=n)
    ax.set_xticks(steps)
    ax.set_xlabel("horizon step")
    ax.set_ylabel("top-1 accuracy")
    ax.set_title("Planner vs baselines")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def paths_per_boundary(went: dict, label: str, png: Path) -> None:
    """Histogram of the paths an adaptive policy sampled per boundary (``went``: its where_paths_went.json)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar([int(k) for k in went["hist"]], list(went["hist"].values()))
    ax.set_xlabel("paths sampled at the boundary")
    ax.set_ylabel("boundaries")
    ax.set_title(f"{label}: paths per boundary (mean {went['paths_mean']:.2f})")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def copy_figure(source: Path, target: Path) -> bool:
    """Copy a figure another stage drew (a sweep's, the actions' cluster sizes) to ``target``; False when there is
    none."""
    if not source.is_file():
        return False
    shutil.copyfile(source, target)
    return True
