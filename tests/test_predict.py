"""predict (the command) and pipeline (the API) on tiny fine-tuned models."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

import debertakit
from debertakit.data.tasks import read_task
from debertakit.predict import Predictor
from debertakit.train.finetune import FinetuneConfig, finetune


def _train(shared_data: Path, tok_dir: Path, out: Path, task: str, train: str, dev: str, **kw) -> Path:
    cfg = FinetuneConfig(
        task=task,
        model="tiny-v3",
        tokenizer=str(tok_dir),
        train=str(shared_data / train),
        dev=str(shared_data / dev),
        out=str(out),
        train_limit=16,
        dev_limit=8,
        max_steps=1,
        batch_size=8,
        lr=1e-3,
        progress=False,
        num_threads=1,
        **kw,
    )
    finetune(cfg)
    return out / "best"


@pytest.fixture(scope="module")
def sst2_model(shared_data_dir, task_tokenizer_dir, tmp_path_factory) -> Path:
    sst = "glue/SST-2/dev.tsv"
    return _train(shared_data_dir, task_tokenizer_dir, tmp_path_factory.mktemp("sst2"), "sst2", sst, sst)


@pytest.fixture(scope="module")
def shared_data_dir() -> Path:
    from tests.conftest import SHARED_DATA

    if not SHARED_DATA.exists():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    return SHARED_DATA


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _predict(model: Path, data: Path, out: Path) -> None:
    from debertakit.cli import main

    main(["predict", "--model", str(model), "--input", str(data), "--out", str(out), "--progress", "false"])


def test_predict_command_matches_the_run_predictions(sst2_model, shared_data_dir, tmp_path, capsys):
    dev = shared_data_dir / "glue/SST-2/dev.tsv"
    _predict(sst2_model, dev, tmp_path / "p.jsonl")
    assert "872 predictions (sst2)" in capsys.readouterr().out
    preds = _lines(tmp_path / "p.jsonl")
    assert len(preds) == 872
    run = _lines(sst2_model.parent / "predictions.jsonl")  # written by finetune for the first 8 dev examples
    for a, b in zip(preds[:8], run):
        assert a["id"] == b["id"] and a["label"] == b["label"]
        for k, v in b["probabilities"].items():
            assert a["probabilities"][k] == pytest.approx(v, abs=1e-5)
    # CSV by extension, nested values as JSON
    _predict(sst2_model, dev, tmp_path / "p.csv")
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert len(rows) == 872 and rows[0]["label"] == preds[0]["label"]
    assert json.loads(rows[0]["probabilities"]) == pytest.approx(preds[0]["probabilities"], abs=1e-9)
    with pytest.raises(ValueError, match="'.txt'"):
        _predict(sst2_model, dev, tmp_path / "p.txt")


def test_classify_pipeline(sst2_model, shared_data_dir):
    clf = debertakit.pipeline("classify", model=sst2_model)
    one = clf("a gorgeous , witty , seductive movie .")
    assert set(one) == {"label", "label_id", "score", "probabilities"} and one["label"] in (
        "negative",
        "positive",
    )
    assert sum(one["probabilities"].values()) == pytest.approx(1.0)
    many = clf(["a gorgeous , witty , seductive movie .", "dull and lifeless ."])
    assert len(many) == 2 and many[0]["label"] == one["label"]
    assert many[0]["probabilities"] == pytest.approx(one["probabilities"], abs=1e-6)  # padded in a batch
    # the same model through the Predictor on reader records gives the same answer
    ex = read_task("sst2", shared_data_dir / "glue/SST-2/dev.tsv").examples[:3]
    assert [p["label"] for p in Predictor(sst2_model).predict(ex)] == [
        p["label"] for p in clf([e.text for e in ex])
    ]
    with pytest.raises(ValueError, match="'answer' needs a qa model"):
        debertakit.pipeline("answer", model=sst2_model)
    with pytest.raises(ValueError, match="unknown pipeline 'summarise'"):
        debertakit.pipeline("summarise", model=sst2_model)


def test_predictions_through_bucketed_padding_are_the_same(sst2_model, shared_data_dir):
    """`run_model` on `CudaGraphModel`'s padded buckets (without graphs on the CPU: the same padding, copying and
    cutting) gives the model's own predictions; `cuda_graphs=True` needs a CUDA device."""
    from debertakit.inference.graphs import DEFAULT_LENGTHS, CudaGraphModel

    examples = read_task("sst2", shared_data_dir / "glue/SST-2/dev.tsv").examples[:40]
    plain = Predictor(sst2_model, batch_size=16)
    bucketed = Predictor(sst2_model, batch_size=16)
    bucketed.model = CudaGraphModel(bucketed.model, replay=False)
    want, got = plain.predict(examples), bucketed.predict(examples)
    assert [p["label"] for p in got] == [p["label"] for p in want]
    for a, b in zip(got, want):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-5)
    shapes = [key[0] for key in bucketed.model.buckets]  # rows 16, 16 and 8, sorted by length
    assert {b for b, _ in shapes} == {16, 8} and {n for _, n in shapes} <= set(DEFAULT_LENGTHS)
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device; the model runs on cpu"):
        Predictor(sst2_model, device="cpu", cuda_graphs=True)


def test_predictions_in_bfloat16_are_near_float32s(sst2_model, shared_data_dir):
    """``dtype="bfloat16"``: the model's weights and activations in bfloat16; probabilities within 2e-2 of
    float32's. A dtype that is not one of the three is refused."""
    examples = read_task("sst2", shared_data_dir / "glue/SST-2/dev.tsv").examples[:40]
    half = Predictor(sst2_model, batch_size=16, dtype="bfloat16")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    want, got = Predictor(sst2_model, batch_size=16).predict(examples), half.predict(examples)
    for a, b in zip(got, want):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=2e-2)
    with pytest.raises(ValueError, match="dtype='fp8'; expected one of"):
        Predictor(sst2_model, dtype="fp8")


def test_extract_and_answer_pipelines(shared_data_dir, task_tokenizer_dir, tmp_path):
    ner_dir = _train(
        shared_data_dir,
        task_tokenizer_dir,
        tmp_path / "ner",
        "conll2003",
        "conll2003/eng.testa",
        "conll2003/eng.testb",
    )
    ner = debertakit.pipeline("extract", model=ner_dir)
    out = ner("John Smith lives in New York")
    assert out["tokens"] == ["John", "Smith", "lives", "in", "New", "York"] and len(out["tags"]) == 6
    from debertakit.data.tasks import CONLL2003_LABELS

    assert all(tag in CONLL2003_LABELS for tag in out["tags"])
    for ent in out["entities"]:
        assert ent["text"] == " ".join(out["tokens"][ent["start"] : ent["end"]])
    assert ner([["Paris"], ["in", "May"]])[1]["tokens"] == ["in", "May"]

    squad = "squad/dev-v1.1-part1.json"
    qa_dir = _train(
        shared_data_dir,
        task_tokenizer_dir,
        tmp_path / "qa",
        "squad",
        squad,
        squad,
        max_length=96,
        doc_stride=32,
    )
    qa = debertakit.pipeline("answer", model=qa_dir)
    context = "The Eiffel Tower was completed in 1889 and stands in Paris on the Champ de Mars."
    ans = qa(question="When was the tower completed?", context=context)
    assert context[ans["start"] : ans["end"]] == ans["answer"] and ans["answer"]
    assert 0 < ans["score"] <= 1
    both = qa(question=["Where?", "When?"], context=context)
    assert len(both) == 2
