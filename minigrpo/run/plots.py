"""After the loop: training curves from metrics.jsonl, as one PNG (needs matplotlib, the `plot` extra)."""

from __future__ import annotations

import json

PANELS = [  # (metric key, title)
    ("reward/mean", "reward"),
    ("eval/accuracy", "held-out accuracy (greedy)"),
    ("completion/length_mean", "completion length (tokens)"),
    ("kl", "KL to reference"),
    ("clip/region_frac", "clipped token fraction"),
]


def plot_curves(metrics_path: str, png_path: str) -> bool:
    """Write the curves; False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    with open(metrics_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    figure, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, (key, title) in zip(axes, PANELS):
        points = [(row["step"], row[key]) for row in rows if key in row]
        if points:
            ax.plot(*zip(*points), marker="." if len(points) < 30 else None)
        else:  # e.g. the KL when beta = 0: there is no reference model
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return True
