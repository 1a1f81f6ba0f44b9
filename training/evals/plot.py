"""harness.png, next to metrics.png in the run directory: each task's metrics, the base model's
bar beside the tuned one's, each with its standard error, so "did the fine-tune work?" reads at a
glance. Drawn with matplotlib on the Agg backend, as metrics.png (training/step/metrics.py)."""

from __future__ import annotations

from pathlib import Path

from training.evals.models import BASE, TUNED

PLOT_FILE = "harness.png"


def _rows(harness: dict) -> list[tuple[str, dict]]:
    """("task metric", its scores) for every metric both models have a number for."""
    return [(f"{task} {metric}", v) for task, by_metric in harness.items()
            for metric, v in by_metric.items()
            if all(isinstance(v[which], (int, float)) for which in (BASE, TUNED))]


def plot_harness(harness: dict, png_path: Path) -> dict[str, list[float]] | None:
    """Draw the summary's `harness` ({task: {metric: {"base", "tuned", "stderr"}}}) into
    `png_path`; returns the bar heights read back from the figure ({"labels", "base", "tuned"}),
    or None, with nothing written, when no metric has both scores."""
    rows = _rows(harness)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(rows)))
    at = list(range(len(rows)))
    bars = {}
    for which, shift, color in ((BASE, 0.2, "C7"), (TUNED, -0.2, "C0")):
        errors = [(v["stderr"] or {}).get(which) or 0.0 for _, v in rows]
        bars[which] = ax.barh([y + shift for y in at], [v[which] for _, v in rows], height=0.4,
                              xerr=errors, color=color, label=which, capsize=3)
    ax.set_yticks(at, [label for label, _ in rows])
    ax.invert_yaxis()  # the summary's order, top down
    ax.set_xlabel("score (bars: lm-eval's stderr)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=80)
    drawn = {"labels": [t.get_text() for t in ax.get_yticklabels()],
             **{which: [p.get_width() for p in bars[which].patches] for which in (BASE, TUNED)}}
    plt.close(fig)
    return drawn
