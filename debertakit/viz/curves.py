"""Training curves from a run's metrics.jsonl, drawn with matplotlib."""

from __future__ import annotations

import json
from pathlib import Path

PANELS = (
    ("mlm_loss", "MLM loss (generator)"),
    ("rtd_loss", "RTD loss (discriminator)"),
    ("mlm_accuracy", "MLM accuracy"),
    ("rtd_accuracy", "RTD accuracy"),
    ("rtd_auc", "RTD AUC (held out)"),
    ("lr", "learning rate"),
)


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir!r} a pretraining run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw train (and held-out) curves of every metric the run logged into one PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    panels = [(k, t) for k, t in PANELS if any(k in r for r in records)]
    if not panels:
        raise ValueError(f"{run_dir}/metrics.jsonl has no metric to plot")
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        for split, style in (("train", "-"), ("eval", "o--")):
            pts = [(r["step"], r[key]) for r in records if r.get("split") == split and key in r]
            if pts:
                ax.plot(*zip(*pts), style, label=split, markersize=4)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(str(Path(run_dir).resolve().name))
    fig.tight_layout()
    path = Path(out) if out else Path(run_dir) / "curves.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
