"""Multi-seed summaries and significance tests between two sets of runs.

A run is a result JSON file `{"metrics": {"accuracy": 0.91, ...}, ...}` (one file per seed). `summarise` gives
min / max / mean / standard deviation (sample, ddof=1) per metric; `compare_runs` tests whether two sets of runs
differ, per metric, with Welch's t-test (unequal variances) and the Mann-Whitney U test (no normality
assumption; exact p-values for small samples without ties), both two-sided, from scipy.
"""

from __future__ import annotations

import glob
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Summary:
    """One metric over several runs (`std` is the sample standard deviation; NaN for a single run)."""

    metric: str
    n: int
    mean: float
    std: float
    min: float
    max: float
    values: tuple[float, ...]


@dataclass(frozen=True)
class Comparison:
    """One metric of two sets of runs and the tests of their difference.

    Attributes:
        metric: metric name.
        a: summary of the first set.
        b: summary of the second set.
        difference: `b.mean - a.mean`.
        welch_t: Welch's t statistic (NaN when undefined: fewer than two runs or no variance on either side).
        welch_p: its two-sided p-value.
        mannwhitney_u: Mann-Whitney U statistic of `a` against `b`.
        mannwhitney_p: its two-sided p-value.
    """

    metric: str
    a: Summary
    b: Summary
    difference: float
    welch_t: float
    welch_p: float
    mannwhitney_u: float
    mannwhitney_p: float


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def summarise(runs: Sequence[Mapping[str, float]]) -> dict[str, Summary]:
    """Min / max / mean / std of every numeric metric over the runs that report it, in first-seen order."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for name, value in run.items():
            if _numeric(value):
                values.setdefault(name, []).append(float(value))
    out = {}
    for name, vs in values.items():
        arr = np.array(vs)
        std = float(arr.std(ddof=1)) if len(arr) > 1 else math.nan
        out[name] = Summary(
            name, len(arr), float(arr.mean()), std, float(arr.min()), float(arr.max()), tuple(vs)
        )
    return out


def compare_runs(
    runs_a: Sequence[Mapping[str, float]],
    runs_b: Sequence[Mapping[str, float]],
    *,
    metrics: Sequence[str] | None = None,
) -> list[Comparison]:
    """Compare two sets of runs metric by metric.

    Args:
        runs_a: metrics of each run of the first set (e.g. baseline).
        runs_b: metrics of each run of the second set.
        metrics: metrics to compare; default: every metric both sets report.

    Returns:
        One `Comparison` per metric.

    Raises:
        ValueError: no runs on a side, or a requested metric missing from a side.
    """
    if not runs_a or not runs_b:
        raise ValueError(f"{len(runs_a)} and {len(runs_b)} runs; expected at least one run on each side")
    sa, sb = summarise(runs_a), summarise(runs_b)
    names = list(metrics) if metrics is not None else [m for m in sa if m in sb]
    for name in names:
        for side, s in (("A", sa), ("B", sb)):
            if name not in s:
                raise ValueError(f"metric {name!r} missing from the runs of {side}; they report {sorted(s)}")
    return [_compare(sa[name], sb[name]) for name in names]


def _compare(a: Summary, b: Summary) -> Comparison:
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # scipy warns on degenerate samples; the result is NaN, reported as n/a
        if a.n > 1 and b.n > 1 and (a.std > 0 or b.std > 0):
            t, p = stats.ttest_ind(a.values, b.values, equal_var=False)
        else:
            t, p = math.nan, math.nan
        u, up = stats.mannwhitneyu(a.values, b.values, alternative="two-sided")
    return Comparison(a.metric, a, b, b.mean - a.mean, float(t), float(p), float(u), float(up))


def _num(x: float, digits: int = 4) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_summary(summaries: Mapping[str, Summary]) -> str:
    """A plain-text table: metric, n, mean, std, min, max."""
    rows = [["metric", "n", "mean", "std", "min", "max"]]
    rows += [
        [s.metric, str(s.n), _num(s.mean), _num(s.std), _num(s.min), _num(s.max)] for s in summaries.values()
    ]
    return _table(rows)


def format_comparison(comparisons: Sequence[Comparison], *, alpha: float = 0.05) -> str:
    """A plain-text table: metric, mean ± std of A and B, difference, both p-values (`*` below `alpha`)."""

    def p(value: float) -> str:
        return _num(value) + (" *" if value < alpha else "")

    rows = [["metric", "A mean ± std (n)", "B mean ± std (n)", "B - A", "Welch p", "Mann-Whitney p"]]
    for c in comparisons:
        rows.append(
            [
                c.metric,
                f"{_num(c.a.mean)} ± {_num(c.a.std)} ({c.a.n})",
                f"{_num(c.b.mean)} ± {_num(c.b.std)} ({c.b.n})",
                f"{c.difference:+.4f}",
                p(c.welch_p),
                p(c.mannwhitney_p),
            ]
        )
    return _table(rows) + f"\n(* p < {alpha}, two-sided)"


def _files(spec: str | Path) -> list[Path]:
    out: list[Path] = []
    for part in str(spec).split(","):
        part = part.strip()
        path = Path(part)
        if path.is_dir():
            out += sorted(path.glob("*.json"))
        elif any(ch in part for ch in "*?["):
            out += sorted(Path(p) for p in glob.glob(part))
        elif path.is_file():
            out.append(path)
        else:
            raise FileNotFoundError(f"{part}: no such file or directory; expected result JSON files")
    if not out:
        raise FileNotFoundError(f"{spec}: no result JSON files found")
    return out


def load_runs(spec: str | Path) -> list[dict[str, float]]:
    """Read the metrics of a set of runs.

    Args:
        spec: a directory (its `*.json` files), a glob pattern, a file, or several of these separated by commas.
            Each file is one run: `{"metrics": {name: number, ...}, ...}`.

    Raises:
        FileNotFoundError: nothing matches.
        ValueError: a file that is not JSON or has no `metrics` object (naming the file).
    """
    runs = []
    for path in _files(spec):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); expected a result file") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
            raise ValueError(f'{path}: no "metrics" object; expected {{"metrics": {{"name": value, ...}}}}')
        runs.append({k: float(v) for k, v in doc["metrics"].items() if _numeric(v)})
    return runs


def compare(
    runs_a: str,
    runs_b: str,
    *,
    metrics: str | None = None,
    alpha: float = 0.05,
    output: str | None = None,
) -> None:
    """Compare two sets of runs (e.g. seeds of a baseline and of a variant) with significance tests.

    Prints the per-metric summary of each set and a table with the difference of means and the two-sided
    p-values of Welch's t-test and the Mann-Whitney U test.

    Args:
        runs_a: result JSON files of the first set: a directory, a glob pattern, or files separated by commas.
        runs_b: result JSON files of the second set, same forms.
        metrics: metrics to compare, separated by commas (default: all that both sets report).
        alpha: significance level marked in the table.
        output: also write the comparison as JSON to this file.
    """
    a, b = load_runs(runs_a), load_runs(runs_b)
    names = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    comparisons = compare_runs(a, b, metrics=names)
    print(f"A: {runs_a} ({len(a)} runs)\n{format_summary(summarise(a))}\n")
    print(f"B: {runs_b} ({len(b)} runs)\n{format_summary(summarise(b))}\n")
    print(format_comparison(comparisons, alpha=alpha))
    if output:
        records = [_nan_to_none(asdict(c)) for c in comparisons]
        Path(output).write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")


def _nan_to_none(value: object) -> object:
    """JSON has no NaN: undefined statistics are written as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_to_none(v) for v in value]
    return value
