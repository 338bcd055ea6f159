"""Matplotlib setup shared by the experiments' plots (headless, one look for every figure)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: experiments run as root in terminals and CI

import matplotlib.pyplot as plt

__all__ = ["COLORS", "figure", "legend", "note", "plt", "save"]

COLORS = {
    "ina": "#1f77b4", "ring": "#d62728", "rina": "#2ca02c", "auto": "#9467bd",
    "equal": "#1f77b4", "static": "#ff7f0e", "adaptive": "#2ca02c",
    "first-fit": "#d62728", "weighted": "#9467bd", "priority": "#8c564b",
}


def figure(ncols: int = 1, nrows: int = 1, width: float = 5.2, height: float = 3.8) -> tuple[Any, Any]:
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def legend(ax: Any, **kwargs: Any) -> None:
    """A legend, if anything was drawn with a label (a run that measured nothing still gets its PNG)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def note(fig: Any, text: str) -> None:
    """A small line of context (configuration) under the plots."""
    fig.text(0.01, 0.005, text, fontsize=7, color="#555555", ha="left", va="bottom")


def save(fig: Any, path: Path, title: str) -> None:
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
