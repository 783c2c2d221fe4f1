"""The experiment runner: stops and resumes (finished runs skipped, half-finished runs continue exactly), writes
the table and non-empty plots."""

from __future__ import annotations

import json

import pytest
import yaml

from debertakit.experiments.runner import ExperimentConfig, run_experiment


def _config(tmp_path, corpus, **changes):
    cfg = {
        "out": str(tmp_path / "exp"),
        "corpus": [str(corpus)],
        "vocab_size": 300,
        "valid_fraction": 0.1,
        "runs": ["full", "no-c2p"],
        "seeds": [0, 1],
        "metrics": ["mlm_loss", "mlm_accuracy"],
        "pretrain": {
            "model": "tiny-v3",
            "model_overrides": {"max_position_embeddings": 32},
            "seq_len": 32,
            "batch_size": 4,
            "max_steps": 4,
            "save_every": 2,
            "log_every": 1,
            "eval_rows": 8,
            "num_threads": 1,
        },
    }
    for k, v in changes.items():
        if k in cfg["pretrain"] or k == "stop_after":
            cfg["pretrain"][k] = v
        else:
            cfg[k] = v
    return ExperimentConfig(**cfg)


@pytest.fixture
def corpus(tmp_path, shared_data):
    lines = (shared_data / "text" / "wikitext-2-valid.txt").read_text(encoding="utf-8").splitlines()[:400]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _result(tmp_path, name, seed):
    return json.loads((tmp_path / "exp" / "runs" / name / f"seed-{seed}" / "result.json").read_text())


def test_runner_stops_resumes_skips_and_tabulates(tmp_path, corpus, shared_data, capsys):
    # 1. every run stops half-way: nothing is finished, each has a checkpoint at step 2
    s = run_experiment(_config(tmp_path, corpus, stop_after=2))
    assert s["trained"] == [] and len(s["pending"]) == 4
    assert (tmp_path / "exp" / "runs" / "full" / "seed-0" / "checkpoints").is_dir()
    assert not (tmp_path / "exp" / "runs" / "full" / "seed-0" / "result.json").exists()
    # 2. one run is finished in this invocation; it resumes from step 2
    capsys.readouterr()
    s = run_experiment(_config(tmp_path, corpus, stop_after_runs=1))
    assert s["trained"] == ["full/seed-0"] and len(s["pending"]) == 3
    assert "resumed from" in capsys.readouterr().out
    first = (tmp_path / "exp" / "runs" / "full" / "seed-0" / "result.json").stat().st_mtime_ns
    # 3. the rest; the finished run is skipped, untouched
    s = run_experiment(_config(tmp_path, corpus))
    assert s["skipped"] == ["full/seed-0"] and len(s["trained"]) == 3 and not s["pending"]
    assert (tmp_path / "exp" / "runs" / "full" / "seed-0" / "result.json").stat().st_mtime_ns == first
    # the resumed run equals an uninterrupted one (same seed, same budget)
    fresh = _config(
        tmp_path,
        corpus,
        runs=["full"],
        seeds=[0],
        out=str(tmp_path / "fresh"),
        data=str(tmp_path / "exp" / "shards"),
    )
    run_experiment(fresh)
    again = json.loads((tmp_path / "fresh" / "runs" / "full" / "seed-0" / "result.json").read_text())
    assert again["metrics"] == pytest.approx(_result(tmp_path, "full", 0)["metrics"], rel=1e-5)
    # a fine-tuning task added later runs for the finished run and joins its row
    fresh.finetune = {
        "sst2": {
            "task": "sst2",
            "train": str(shared_data / "glue" / "SST-2" / "dev.tsv"),
            "dev": str(shared_data / "glue" / "SST-2" / "dev.tsv"),
            "train_limit": 16,
            "dev_limit": 16,
            "max_length": 32,
            "max_steps": 2,
            "batch_size": 8,
            "num_threads": 1,
        }
    }
    fresh.metrics = None
    s2 = run_experiment(fresh)
    assert s2["skipped"] == ["full/seed-0"] and not s2["pending"]
    row = json.loads((tmp_path / "fresh" / "results.json").read_text())["rows"][0]
    assert 0.0 <= row["metrics"]["sst2_accuracy"]["mean"] <= 1.0 and "mlm_loss" in row["metrics"]
    # the table and the figures
    table = json.loads((tmp_path / "exp" / "results.json").read_text())
    rows = {r["name"]: r for r in table["rows"]}
    assert rows["full"]["n"] == 2 and rows["no-c2p"]["n"] == 2
    e = rows["no-c2p"]["metrics"]["mlm_loss"]
    want = sum(_result(tmp_path, "no-c2p", s)["metrics"]["mlm_loss"] for s in (0, 1)) / 2
    assert e["mean"] == pytest.approx(want) and "welch_p" in e and "mannwhitney_p" in e
    assert e["difference"] == pytest.approx(e["mean"] - rows["full"]["metrics"]["mlm_loss"]["mean"])
    md = (tmp_path / "exp" / "results.md").read_text()
    assert "| no-c2p | 2 |" in md
    for f in s["figures"]:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert any(f.endswith("mlm_loss.png") for f in s["figures"])


def test_config_files_load_and_name_known_variants():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "configs" / "experiments").glob("*.yaml")):
        cfg = ExperimentConfig.load(path)
        specs = cfg.specs()
        assert specs and len(cfg.seeds) >= 2
        from debertakit.train.pretrain import PretrainConfig

        for spec in specs:
            PretrainConfig(
                data="x",
                objective=spec.objective or "mlm",
                variant=spec.variant,
                **{**cfg.pretrain, **spec.pretrain},
            )


def test_bad_config_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"out": "x", "runs": ["full"], "sedes": [1]}))
    with pytest.raises(ValueError, match="unknown field"):
        ExperimentConfig.load(path)
    with pytest.raises(ValueError, match="unknown ablation variant"):
        ExperimentConfig(out="x", runs=["nope"]).specs()
