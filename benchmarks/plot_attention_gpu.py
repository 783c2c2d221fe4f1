"""Plot of the GPU attention benchmark: TFLOP/s against N for every implementation, forward and forward+backward,
beside the issue's targets and the caps of `triton_bounds`.

The benchmark's results file (`attention_gpu.json`, its `attention` section: batch·N fixed, N from 128 up) holds
the numbers; this draws them so that the gaps show at a glance:

- each implementation's line; the `triton` roads in colour, sdpa without position terms (the ceiling) in black,
  our kernels without position terms (`triton (no position terms)`: the loops' own ceiling) dashed;
- each near-band road's cap from `triton_bounds.json` as a triangle of the road's colour, timed or not: no
  implementation of that road's data flow can beat it on that GPU (the bounds' rows of the results' GPU model
  only; none if the bounds hold no row for it);
- the targets (red bars) and 40% of sdpa's throughput (red dotted), where the issue sets them.

It runs without a GPU, from the committed files (the GPU machine need not have matplotlib):

    python benchmarks/plot_attention_gpu.py     # benchmarks/results/attention_gpu.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention_gpu  # noqa: E402

from debertakit.convert.checkpoint import atomic_write  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# (the results' metric, the panel's title, the bounds' cap of that metric, its index in `attention_gpu.targets`)
PANELS = (
    ("fwd_tflops", "forward", "forward_tflops_cap", 0),
    ("fwd_bwd_tflops", "forward + backward", "fwd_bwd_tflops_cap", 1),
)
# one colour per near-band road, the same for its measured line and its cap
ROAD_COLOURS = {
    "tables": "tab:blue",
    "distance": "tab:orange",
    "skew-forward": "tab:green",
    "skew": "tab:purple",
}
TARGET_COLOUR = "tab:red"
# the other implementations, in the order they first appear: colours none of the above uses
OTHER_COLOURS = (
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
    "gold",
    "darkkhaki",
    "rosybrown",
)


def series(rows: list[dict], metric: str, section: str = "attention") -> dict[str, list[tuple[int, float]]]:
    """Per implementation, the (N, value) points of ``metric`` in ``section``, by N; rows without the value (a
    failed or skipped measurement) are left out, and so are implementations with none."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["section"] == section and isinstance(r.get(metric), (int, float)):
            out.setdefault(r["impl"], []).append((r["n"], float(r[metric])))
    return {impl: sorted(points) for impl, points in out.items()}


def road(impl: str, default: str) -> str | None:
    """The near-band road a results row ran (`triton_backend.NEAR_BAND_MODES`); None for rows of other code.
    The plain `triton` row ran the default road of its run, ``default`` (`default_road`)."""
    if impl == "triton":
        return default
    return attention_gpu.NEAR_BAND_ROWS.get(impl)


def default_road(results: dict) -> str:
    """The road the results' plain `triton` rows ran: their environment's ``near_band``; "tables" for files
    written before it was recorded, when that was the default."""
    return results.get("environment", {}).get("near_band", "tables")


def caps(bounds: dict, device: str) -> dict[str, dict[int, dict]]:
    """The bounds' rows for the GPU model of ``device`` (the results' device name, "NVIDIA H100 80GB HBM3" say:
    the bounds' GPU keys, "h100", found in it), per road and N; empty where the bounds have no such GPU."""
    names = [spec["name"] for key, spec in bounds.get("gpus", {}).items() if key.upper() in device.upper()]
    out: dict[str, dict[int, dict]] = {}
    for r in bounds.get("rows", []):
        if r["gpu"] in names:
            out.setdefault(r["road"], {})[r["n"]] = r
    return out


def _style(impl: str, others: list[str], default: str) -> dict:
    """How ``impl``'s line is drawn; ``others``: the implementations of neither kind below, in order."""
    if road(impl, default) is not None:
        # a road row of the default road runs what `triton` runs: dashed, so the two lines stay apart
        twin = impl != "triton" and road(impl, default) == default
        style = dict(color=ROAD_COLOURS.get(road(impl, default)), marker="o", linewidth=2.2, markersize=4)
        return dict(style, linestyle="--", linewidth=1.4) if twin else style
    if impl == attention_gpu.SDPA_ROW:
        return dict(color="black", marker="s", linewidth=1.8, markersize=3)
    if impl == attention_gpu.PLAIN_ROW:
        return dict(color="tab:blue", linestyle="--", marker=".", linewidth=1.4)
    return dict(color=OTHER_COLOURS[others.index(impl) % len(OTHER_COLOURS)], linewidth=1.0, marker=".")


def figure(results: dict, bounds: dict | None):
    """The two panels (forward, forward+backward) as a matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = results.get("environment", {})
    limits = caps(bounds or {}, env.get("device", ""))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 5.6), sharey=True)
    for ax, panel in zip(axes, PANELS):
        _panel(ax, results["rows"], limits, default_road(results), *panel)
    axes[0].set_ylabel("TFLOP/s (4·N²·d per head forward, 3.5× that forward+backward)")
    handles, labels = axes[-1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    first = next(r for r in results["rows"] if r["section"] == "attention")  # (the panels found one)
    fig.suptitle(
        f"{env.get('device', 'unknown GPU')}: attention layer, {first['heads']} heads, d {first['head_dim']} "
        f"({env.get('date', '')[:10]}; torch {env.get('torch')}, Triton {env.get('triton')})"
    )
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    return fig


def _panel(
    ax, rows: list[dict], limits: dict, default: str, metric: str, title: str, cap_key: str, target_index: int
) -> None:
    """One panel: the measured lines, every road's caps (timed or not: what it could reach), the targets."""
    lines = series(rows, metric)
    if not lines:
        raise ValueError(f"the results hold no {metric!r} in their attention section: nothing to plot")
    others = [
        impl
        for impl in lines
        if road(impl, default) is None and impl not in (attention_gpu.SDPA_ROW, attention_gpu.PLAIN_ROW)
    ]
    for impl, points in lines.items():
        ax.plot(*zip(*points), label=impl, **_style(impl, others, default))
    for name, by_n in limits.items():
        points = sorted((n, r[cap_key]) for n, r in by_n.items())
        ax.plot(
            *zip(*points), "v", color=ROAD_COLOURS.get(name), markersize=9, alpha=0.6, label=f"cap: {name}"
        )
    lengths = sorted({n for points in lines.values() for n, _ in points})
    wanted = [(n, attention_gpu.targets(n)[target_index]) for n in lengths]
    wanted = [(n, t) for n, t in wanted if t is not None]
    if wanted:
        ax.plot(*zip(*wanted), "_", color=TARGET_COLOUR, markersize=18, mew=2.5, label="target")
    share = [
        (n, attention_gpu.SDPA_SHARE * v)
        for n, v in lines.get(attention_gpu.SDPA_ROW, [])
        if n >= attention_gpu.SDPA_SHARE_FROM
    ]
    if share:
        ax.plot(
            *zip(*share), ":", color=TARGET_COLOUR, label=f"target: {attention_gpu.SDPA_SHARE:.0%} of sdpa"
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("N (batch·N fixed)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS / "attention_gpu.json")
    p.add_argument(
        "--bounds", type=Path, default=RESULTS / "triton_bounds.json", help="a missing file: no caps"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "attention_gpu.png")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    bounds = json.loads(args.bounds.read_text()) if args.bounds.exists() else None
    fig = figure(results, bounds)
    atomic_write(args.out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
