"""PNG plots with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def grouped_bars(path: str | Path, title: str, groups: Sequence[str], series: Mapping[str, Sequence[float | None]],
                 ylabel: str, log: bool = False) -> Path:
    """One bar per series inside each group; missing values are left out."""
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.0, 0.25 * len(groups) * max(1, len(series)))), 4.5))
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series.items()):
        xs = [i + k * width for i, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def lines(path: str | Path, title: str, xs: Sequence[float], series: Mapping[str, Sequence[float | None]],
          xlabel: str, ylabel: str, logx: bool = False, logy: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for label, values in series.items():
        pts = [(x, y) for x, y in zip(xs, values) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def frontier(path: str | Path, title: str, points: Sequence[tuple[str, str, float, float]],
             xlabel: str, ylabel: str, floor: float = 1e-7) -> Path:
    """Cost/quality scatter, log-log: ``(group, label, x, y)`` per point; one colour per group,
    one marker per label; values below ``floor`` are drawn at ``floor``."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    groups = list(dict.fromkeys(g for g, _, _, _ in points))
    labels = list(dict.fromkeys(lab for _, lab, _, _ in points))
    markers = "osD^vP*X"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for g, lab, x, y in points:
        ax.scatter(max(x, floor), max(y, floor), color=colors[groups.index(g) % len(colors)],
                   marker=markers[labels.index(lab) % len(markers)], s=46)
    for gi, g in enumerate(groups):
        ax.scatter([], [], color=colors[gi % len(colors)], marker="s", label=g)
    for li, lab in enumerate(labels):
        ax.scatter([], [], color="gray", marker=markers[li % len(markers)], label=lab)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
