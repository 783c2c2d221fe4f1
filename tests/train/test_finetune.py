"""Fine-tuning a tiny model for a few steps on every task family of ../shared/data; resume; seeds; predict."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from debertakit import DebertaConfig, build_model, save_pretrained
from debertakit.data.tasks import read_task
from debertakit.evaluate.metrics import task_metrics
from debertakit.evaluate.significance import load_runs
from debertakit.train.finetune import FinetuneConfig, default_lr, finetune, finetune_seeds, parameter_groups


def _cfg(
    shared_data: Path, tok_dir: Path, out: Path, task: str, train: str, dev: str, **kw
) -> FinetuneConfig:
    base = dict(
        model="tiny-v3",
        tokenizer=str(tok_dir),
        train_limit=24,
        dev_limit=12,
        max_steps=3,
        batch_size=8,
        eval_batch_size=16,
        lr=1e-3,
        progress=False,
        num_threads=1,
        log_every=1,
    )
    base.update(kw)
    return FinetuneConfig(
        task=task, train=str(shared_data / train), dev=str(shared_data / dev), out=str(out), **base
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory, task_tokenizer, task_tokenizer_dir) -> Path:
    """A tiny masked-LM checkpoint with the test vocabulary, as pretraining writes it (weights + tokenizer)."""
    out = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    cfg = DebertaConfig.preset("tiny-v3", vocab_size=task_tokenizer.vocab_size)
    save_pretrained(build_model(cfg, "masked_lm"), out)
    task_tokenizer.save_pretrained(out)
    return out


def test_glue_classification_from_a_pretrained_directory(shared_data, pretrained_dir, tmp_path):
    cfg = _cfg(
        shared_data, pretrained_dir, tmp_path, "rte", "glue/RTE/dev.tsv", "glue/RTE/dev.tsv", eval_every=2
    )
    cfg.model = str(pretrained_dir)
    result = finetune(cfg)
    assert set(result["metrics"]) == {"accuracy"} and result["train_examples"] == 24
    # predictions of the best model, one per dev example, and the metric recomputed from them
    preds = _lines(tmp_path / "predictions.jsonl")
    gold = read_task("rte", shared_data / "glue/RTE/dev.tsv").examples[:12]
    assert len(preds) == 12 and {p["label"] for p in preds} <= {"entailment", "not_entailment"}
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-6 for p in preds)
    again = task_metrics("rte", [p["label_id"] for p in preds], [e.label for e in gold])
    assert again["accuracy"] == pytest.approx(result["metrics"]["accuracy"])
    # the log: train lines every step, dev evaluations at steps 2 and 3; the best is the first maximum
    log = _lines(tmp_path / "metrics.jsonl")
    dev = [r for r in log if r["split"] == "dev"]
    assert [r["step"] for r in dev] == [2, 3]
    assert [r["step"] for r in log if r["split"] == "train"] == [1, 2, 3]
    best = max(dev, key=lambda r: (r["accuracy"], -r["step"]))
    assert result["best_step"] == best["step"] and result["metrics"]["accuracy"] == best["accuracy"]
    assert json.loads((tmp_path / "result.json").read_text())["metrics"] == result["metrics"]
    for name in ("config.json", "model.safetensors", "spm.model", "task.json"):
        assert (tmp_path / "best" / name).is_file()


def test_regression_with_sift(shared_data, task_tokenizer_dir, tmp_path):
    cfg = _cfg(
        shared_data,
        task_tokenizer_dir,
        tmp_path,
        "stsb",
        "glue/STS-B/dev.tsv",
        "glue/STS-B/dev.tsv",
        sift=True,
    )
    result = finetune(cfg)
    assert set(result["metrics"]) == {"pearson", "spearman"}
    assert all(math.isfinite(v) for v in result["metrics"].values())
    train = [r for r in _lines(tmp_path / "metrics.jsonl") if r["split"] == "train"]
    assert all(r["sift_loss"] > 0 for r in train)  # the adversarial term is trained on
    preds = _lines(tmp_path / "predictions.jsonl")
    assert len(preds) == 12 and all(isinstance(p["score"], float) for p in preds)


def test_squad(shared_data, task_tokenizer_dir, tmp_path):
    squad = "squad/dev-v1.1-part1.json"
    cfg = _cfg(
        shared_data,
        task_tokenizer_dir,
        tmp_path,
        "squad",
        squad,
        squad,
        max_length=96,
        doc_stride=32,
        train_limit=8,
    )
    result = finetune(cfg)
    assert set(result["metrics"]) == {"exact_match", "f1"}
    assert result["train_rows"] > result["train_examples"]  # contexts split into windows
    examples = {e.id: e for e in read_task("squad", shared_data / squad).examples[:12]}
    preds = _lines(tmp_path / "predictions.jsonl")
    assert [p["id"] for p in preds] == list(examples)
    for p in preds:
        context = examples[p["id"]].context
        assert context[p["start"] : p["end"]] == p["answer"] and p["answer"] == p["answer"].strip()
    answers = {p["id"]: p["answer"] for p in preds}
    assert task_metrics("squad", answers, list(examples.values()))["f1"] == pytest.approx(
        result["metrics"]["f1"]
    )


def test_ner(shared_data, task_tokenizer_dir, tmp_path):
    cfg = _cfg(
        shared_data, task_tokenizer_dir, tmp_path, "conll2003", "conll2003/eng.testa", "conll2003/eng.testb"
    )
    result = finetune(cfg)
    assert set(result["metrics"]) == {"precision", "recall", "f1", "accuracy"}
    gold = read_task("conll2003", shared_data / "conll2003/eng.testb").examples[:12]
    preds = _lines(tmp_path / "predictions.jsonl")
    assert [p["tokens"] for p in preds] == [list(e.tokens) for e in gold]
    assert all(len(p["tags"]) == len(p["tokens"]) for p in preds)
    for p in preds:
        for ent in p["entities"]:
            assert ent["text"] == " ".join(p["tokens"][ent["start"] : ent["end"]])
            assert p["tags"][ent["start"]][2:] == ent["type"]


def test_resume_gives_the_same_run(shared_data, task_tokenizer_dir, tmp_path):
    """Stopped after 2 steps and resumed = uninterrupted: same losses, same dev scores, same weights (dropout
    and SiFT noise on, so the random states must be restored)."""
    kw = dict(
        max_steps=5, eval_every=2, sift=True, sift_init_std=0.1, sift_step_size=0.01, hidden_dropout=0.1
    )
    args = (shared_data, task_tokenizer_dir)
    whole = _cfg(*args, tmp_path / "whole", "sst2", "glue/SST-2/dev.tsv", "glue/SST-2/dev.tsv", **kw)
    parts = _cfg(*args, tmp_path / "parts", "sst2", "glue/SST-2/dev.tsv", "glue/SST-2/dev.tsv", **kw)
    finetune(whole)
    parts.stop_after = 3
    assert finetune(parts) == {"step": 3, "stopped": True}
    parts.stop_after = None
    finetune(parts)
    a, b = _lines(tmp_path / "whole/metrics.jsonl"), _lines(tmp_path / "parts/metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for k, v in ra.items():
            expected = pytest.approx(v, rel=1e-6, abs=1e-9) if isinstance(v, float) else v
            assert rb[k] == expected, (ra["step"], k)
    from debertakit.convert.checkpoint import read_state_dict

    wa, wb = read_state_dict(tmp_path / "whole/best"), read_state_dict(tmp_path / "parts/best")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-6, atol=1e-7)


def test_seeds_summary_and_compare(shared_data, task_tokenizer_dir, tmp_path, capsys):
    cfg = _cfg(
        shared_data,
        task_tokenizer_dir,
        tmp_path,
        "mrpc",
        "glue/MRPC/msr_paraphrase_test.txt",
        "glue/MRPC/msr_paraphrase_test.txt",
        max_steps=2,
        seeds="1,2",
    )
    out = finetune_seeds(cfg)
    assert [r["seed"] for r in out["runs"]] == [1, 2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    acc = summary["summary"]["accuracy"]
    values = [r["metrics"]["accuracy"] for r in out["runs"]]
    assert acc["n"] == 2 and acc["min"] == min(values) and acc["max"] == max(values)
    assert acc["mean"] == pytest.approx(sum(values) / 2)
    runs = load_runs(str(tmp_path / "runs"))
    assert [r["accuracy"] for r in runs] == values
    from debertakit.cli import main

    main(["compare", str(tmp_path / "runs"), str(tmp_path / "runs"), "--metrics", "accuracy"])
    assert "accuracy" in capsys.readouterr().out


def test_early_stopping(shared_data, task_tokenizer_dir, tmp_path):
    # a learning rate too small to change any prediction: the dev score never improves after the first
    cfg = _cfg(
        shared_data,
        task_tokenizer_dir,
        tmp_path,
        "cola",
        "glue/CoLA/dev.tsv",
        "glue/CoLA/dev.tsv",
        max_steps=6,
        eval_every=1,
        patience=2,
        lr=1e-12,
        warmup_steps=0,
    )
    result = finetune(cfg)
    assert result["stopped_early"] and result["steps"] == 3 and result["best_step"] == 1


def test_layer_wise_learning_rates():
    model = build_model(DebertaConfig.preset("tiny-v3"), "sequence_classification")
    groups = parameter_groups(model, 1e-3, 0.5, 0.01)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert lr_of[id(named["classification_head.classifier.weight"])] == 1e-3
    assert lr_of[id(named["deberta.encoder.layers.1.attention.query.weight"])] == pytest.approx(5e-4)
    assert lr_of[id(named["deberta.encoder.layers.0.attention.query.weight"])] == pytest.approx(2.5e-4)
    assert lr_of[id(named["deberta.embeddings.word.weight"])] == pytest.approx(1.25e-4)
    assert wd_of[id(named["deberta.embeddings.norm.weight"])] == 0.0
    assert wd_of[id(named["deberta.encoder.layers.0.attention.query.bias"])] == 0.0
    assert wd_of[id(named["deberta.encoder.layers.0.attention.query.weight"])] == 0.01
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert default_lr(768) == 2e-5 and default_lr(1024) == 8e-6


def test_bad_options_are_named(shared_data, tmp_path):
    with pytest.raises(ValueError, match="unknown task 'sst3'"):
        FinetuneConfig(task="sst3", model="m", train="t", dev="d")
    with pytest.raises(ValueError, match="seeds '1,x'"):
        FinetuneConfig(task="sst2", model="m", train="t", dev="d", seeds="1,x")
    with pytest.raises(ValueError, match="layer_decay=1.5"):
        FinetuneConfig(task="sst2", model="m", train="t", dev="d", layer_decay=1.5)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "configs" / "finetune").glob("*.yaml")))
def test_finetune_configs_are_valid(path):
    import yaml

    doc = yaml.safe_load(path.read_text())
    cfg = FinetuneConfig(**{"model": "DIR", **doc})  # every key a field, every value valid
    assert cfg.task == doc["task"]


def test_boolean_options_are_switches():
    from debertakit.cli import _commands, _expand_switches

    commands = _commands()
    argv = ["finetune", "--sift", "--lr", "1e-4", "--group_by_length"]
    assert _expand_switches(argv, commands) == [
        "finetune",
        "--sift",
        "true",
        "--lr",
        "1e-4",
        "--group_by_length",
        "true",
    ]
    assert _expand_switches(["finetune", "--sift", "false"], commands) == ["finetune", "--sift", "false"]
    assert _expand_switches(["finetune", "--out", "--x"], commands) == [
        "finetune",
        "--out",
        "--x",
    ]  # not a bool


def test_multiple_choice_and_own_csv(task_tokenizer_dir, tmp_path):
    """Task families without a shared data set: multiple choice (JSON lines) and users' own CSV."""
    import random

    rng = random.Random(0)
    words = ["red", "green", "blue", "cat", "dog", "house", "river", "stone"]
    with (tmp_path / "mc.jsonl").open("w") as f:
        for i in range(12):
            choices = rng.sample(words, 4)
            f.write(
                json.dumps({"context": f"story {i}", "question": "pick", "choices": choices, "label": i % 4})
                + "\n"
            )
    with (tmp_path / "own.csv").open("w") as f:
        f.write("text,label\n")
        for i in range(12):
            f.write(f"{rng.choice(words)} {rng.choice(words)},{'yes' if i % 3 else 'no'}\n")
    for task, data in (("multiple_choice", "mc.jsonl"), ("text_classification", "own.csv")):
        out = tmp_path / task
        cfg = FinetuneConfig(
            task=task,
            model="tiny-v3",
            tokenizer=str(task_tokenizer_dir),
            train=str(tmp_path / data),
            dev=str(tmp_path / data),
            out=str(out),
            max_steps=2,
            batch_size=4,
            lr=1e-3,
            progress=False,
            num_threads=1,
        )
        result = finetune(cfg)
        assert "accuracy" in result["metrics"]
        preds = _lines(out / "predictions.jsonl")
        assert len(preds) == 12
        if task == "multiple_choice":
            assert all(len(p["probabilities"]) == 4 for p in preds)
        else:
            assert {p["label"] for p in preds} <= {"no", "yes"}
