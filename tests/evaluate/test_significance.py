"""Multi-seed summaries and significance tests on data where the answer is known; the `compare` command."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from debertakit.evaluate.significance import (
    compare,
    compare_runs,
    format_comparison,
    format_summary,
    load_runs,
    summarise,
)


def runs(**metrics):
    """runs(acc=[...], f1=[...]) -> one dict per run."""
    n = len(next(iter(metrics.values())))
    return [{k: v[i] for k, v in metrics.items()} for i in range(n)]


def test_summary_hand_checked():
    s = summarise([*runs(acc=[1.0, 2.0, 3.0, 4.0]), {"acc": 2.5, "name": "x", "flag": True}])["acc"]
    assert (s.n, s.mean, s.min, s.max) == (5, 2.5, 1.0, 4.0)
    assert s.std == pytest.approx(math.sqrt(5 / 4))  # sample variance: (2.25 + .25 + .25 + 2.25 + 0) / 4
    assert set(summarise([{"acc": 1.0, "name": "x", "flag": True}])) == {"acc"}
    assert math.isnan(summarise([{"acc": 1.0}])["acc"].std)


def test_clearly_separated_sets():
    a = runs(acc=[0.80, 0.81, 0.79, 0.83, 0.82])
    b = runs(acc=[0.90, 0.91, 0.89, 0.92, 0.88])
    (c,) = compare_runs(a, b)
    assert c.difference == pytest.approx(0.09)
    # Exact Mann-Whitney: complete separation of 5 vs 5 has probability 2 / C(10, 5) = 2 / 252.
    assert c.mannwhitney_p == pytest.approx(2 / 252) and c.mannwhitney_u == 0.0
    assert c.welch_t == pytest.approx(-9.0) and c.welch_p < 1e-4  # se = sqrt(2 * 0.00025 / 5) = 0.01, df 8


def test_welch_matches_the_formula():
    a, b = [1.0, 2.0, 4.0, 7.0], [3.0, 5.0, 6.0, 9.0, 12.0, 4.0]
    (c,) = compare_runs(runs(m=a), runs(m=b))
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    assert c.welch_t == pytest.approx(t)
    assert c.welch_p == pytest.approx(2 * stats.t.sf(abs(t), df))


def test_identical_sets_and_degenerate_cases():
    (c,) = compare_runs(runs(acc=[0.1, 0.2, 0.3]), runs(acc=[0.3, 0.1, 0.2]))
    assert c.difference == pytest.approx(0.0) and c.welch_p == pytest.approx(1.0) and c.mannwhitney_p == 1.0
    (c,) = compare_runs(runs(acc=[0.5]), runs(acc=[0.6, 0.7]))
    assert math.isnan(c.welch_p) and "n/a" in format_comparison([c])
    (c,) = compare_runs(runs(acc=[0.5, 0.5]), runs(acc=[0.5, 0.5]))
    assert math.isnan(c.welch_p)


def test_false_positive_rate_near_alpha():
    """Same distribution on both sides: about 5 % of comparisons have p < 0.05."""
    rng = np.random.default_rng(0)
    ps = [compare_runs(runs(m=rng.normal(size=8)), runs(m=rng.normal(size=8)))[0].welch_p for _ in range(400)]
    assert 0.02 < np.mean(np.array(ps) < 0.05) < 0.09
    shifted = [
        compare_runs(runs(m=rng.normal(size=8)), runs(m=rng.normal(2.0, size=8)))[0].welch_p
        for _ in range(100)
    ]
    assert np.mean(np.array(shifted) < 0.05) > 0.9  # a 2-sigma shift is almost always found with 8 runs each


def test_metric_selection_and_errors():
    a, b = runs(acc=[0.1, 0.2], f1=[0.3, 0.4]), runs(acc=[0.2, 0.3], mcc=[0.1, 0.2])
    assert [c.metric for c in compare_runs(a, b)] == ["acc"]
    with pytest.raises(ValueError, match="metric 'f1' missing from the runs of B"):
        compare_runs(a, b, metrics=["f1"])
    with pytest.raises(ValueError, match="0 and 2 runs"):
        compare_runs([], b)


def write_runs(folder, values, metric="accuracy"):
    folder.mkdir()
    for seed, value in enumerate(values):
        (folder / f"seed{seed}.json").write_text(
            json.dumps({"seed": seed, "metrics": {metric: value, "tag": "x"}})
        )
    return folder


def test_load_runs_forms(tmp_path):
    a = write_runs(tmp_path / "a", [0.8, 0.81, 0.82])
    assert [r["accuracy"] for r in load_runs(a)] == [0.8, 0.81, 0.82]
    assert len(load_runs(f"{a}/seed*.json")) == 3
    assert len(load_runs(f"{a}/seed0.json,{a}/seed2.json")) == 2
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        load_runs(tmp_path / "nope")
    (tmp_path / "bad.json").write_text('{"accuracy": 0.9}')
    with pytest.raises(ValueError, match=r'bad.json: no "metrics" object'):
        load_runs(tmp_path / "bad.json")


def test_compare_command(tmp_path, capsys):
    a = write_runs(tmp_path / "base", [0.80, 0.81, 0.79, 0.83, 0.82])
    b = write_runs(tmp_path / "sift", [0.90, 0.91, 0.89, 0.92, 0.88])
    from jsonargparse import CLI

    out_file = tmp_path / "cmp.json"
    args = ["compare", str(a), str(b), "--metrics", "accuracy", "--output", str(out_file)]
    CLI({"compare": compare}, args=args, as_positional=True)
    text = capsys.readouterr().out
    assert "(5 runs)" in text and "accuracy" in text and "+0.0900" in text and "0.0079 *" in text
    (record,) = json.loads(out_file.read_text())
    assert record["metric"] == "accuracy" and record["mannwhitney_p"] == pytest.approx(2 / 252)


def test_compare_is_a_cli_subcommand(tmp_path, capsys):
    from debertakit import cli

    try:
        commands = cli._commands()
    except ImportError as e:  # another subcommand's module is not in this checkout
        pytest.skip(f"CLI commands not importable here: {e}")
    assert commands["compare"] is compare
    a = write_runs(tmp_path / "a", [0.1, 0.2])
    b = write_runs(tmp_path / "b", [0.3, 0.4])
    cli.main(["compare", str(a), str(b), "--alpha", "0.1"])
    assert "(* p < 0.1, two-sided)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="metric 'f1' missing from the runs of A"):
        cli.main(["compare", str(a), str(b), "--metrics", "accuracy,f1"])


def test_tables_are_readable():
    a, b = runs(acc=[0.8, 0.9], f1=[0.7, 0.75]), runs(acc=[0.85, 0.95], f1=[0.72, 0.78])
    table = format_comparison(compare_runs(a, b))
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["metric", "A"] and set(lines[1]) <= {"-", " "}
    assert lines[2].startswith("acc ") and lines[3].startswith("f1 ")
    summary = format_summary(summarise(a)).splitlines()
    assert summary[2].split() == ["acc", "2", "0.8500", "0.0707", "0.8000", "0.9000"]
