"""PNG plots with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


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


def policy_frontier(path: str | Path, title: str, curves: Mapping[str, Sequence[tuple[str, float, float]]],
                    xlabel: str, ylabel: str) -> Path:
    """One panel per model: ``(policy, cost, drift)`` points, log-log. The forget-every-N family
    (amortize, forget-every-N by cost) is joined by a line; other policies are single markers;
    ``forget`` (cost 1, no drift) is left off the log axis."""
    n = max(1, len(curves))
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), squeeze=False)
    markers = "*PXDv^"
    for ax, (model, points) in zip(axes.flat, curves.items()):
        family = sorted((x, y, p) for p, x, y in points
                        if (p == "amortize" or p.startswith("forget-every-")) and x > 0 and y > 0)
        ax.plot([f[0] for f in family], [f[1] for f in family], color="gray", marker="o", label="forget-every-N")
        for x, y, p in family:
            ax.annotate(p.replace("forget-every-", "N="), (x, y), fontsize=7, textcoords="offset points",
                        xytext=(4, 4))
        others = [(p, x, y) for p, x, y in points
                  if p not in ("amortize", "forget") and not p.startswith("forget-every-") and x > 0 and y > 0]
        for k, (p, x, y) in enumerate(others):
            ax.scatter([x], [y], marker=markers[k % len(markers)], s=90, color=f"C{k + 1}", label=p, zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
        ax.set_title(model, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
