"""Inference with fine-tuned models: batched forward passes, decoding of the outputs into predictions (labels and
probabilities, scores, answer spans, entities), `debertakit predict`, and the `pipeline` API.

A fine-tuned model directory (what `debertakit finetune` writes as `best/`) holds the Hugging Face-format model,
the tokenizer files and `task.json` (the task name, its kind, label names and featurisation lengths), so that
a model directory is all that inference needs.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from debertakit.data.features import Collator, Features, featurize
from debertakit.data.tasks import QAExample, TextExample, TokenExample, get_task

TASK_FILE = "task.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HEADS = {
    "classification": "sequence_classification",
    "regression": "sequence_classification",
    "ner": "token_classification",
    "qa": "question_answering",
    "multiple_choice": "multiple_choice",
}


# ------------------------------------------------------------------------------------------------ forward passes
@torch.no_grad()
def run_model(
    model: torch.nn.Module,
    features: Features,
    *,
    batch_size: int = 64,
    pad_token_id: int = 0,
    device: torch.device | str = "cpu",
    amp: torch.dtype | None = None,
    progress: bool = False,
    desc: str = "predict",
) -> list[np.ndarray] | list[tuple[np.ndarray, np.ndarray]]:
    """Logits of every row, unpadded: (C,) per row for sequence tasks, (N, C) for NER, (start (N,), end (N,)) for
    QA. Rows are run in order of length, so batches hold rows of similar length, and returned in input order."""
    from tqdm.auto import tqdm

    device = torch.device(device)
    was_training = model.training
    model.eval()
    collate = Collator(pad_token_id)
    lengths = features.lengths()
    order = sorted(range(len(features)), key=lambda i: -lengths[i])
    out: list[Any] = [None] * len(features)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        idx = order[start : start + batch_size]
        batch = collate([{k: features.inputs[i][k] for k in keys} for i in idx])
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            res = model(**batch)
        if hasattr(res, "start_logits"):
            s, e = res.start_logits.float().cpu().numpy(), res.end_logits.float().cpu().numpy()
            for j, i in enumerate(idx):
                out[i] = (s[j, : lengths[i]], e[j, : lengths[i]])
            continue
        logits = res.logits.float().cpu().numpy()
        for j, i in enumerate(idx):
            out[i] = logits[j, : lengths[i]] if features.kind == "ner" else logits[j]
    model.train(was_training)
    return out


# ------------------------------------------------------------------------------------------------------ decoding
def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def decode_sequences(logits: Sequence[np.ndarray], kind: str, labels: Sequence[str] | None) -> list[dict]:
    """Classification: label, label id, probability of each label; regression: score; multiple choice: the
    chosen index and the probability of each choice."""
    out = []
    for z in logits:
        if kind == "regression":
            out.append({"score": float(z[0])})
            continue
        p = _softmax(np.asarray(z, dtype=np.float64))
        k = int(p.argmax())
        names = list(labels) if labels and kind == "classification" else [str(i) for i in range(len(p))]
        rec = {"label": names[k], "label_id": k, "score": float(p[k])}
        rec["probabilities"] = {n: float(v) for n, v in zip(names, p)}
        out.append(rec)
    return out


def decode_ner(
    logits: Sequence[np.ndarray], features: Features, examples: Sequence[TokenExample], labels: Sequence[str]
) -> list[dict]:
    """Per word: the tag predicted on its first sub-token ("O" for words cut by truncation); the entities
    (seqeval's reading of the IOB2 tags) with word indices (end exclusive) and text."""
    from seqeval.metrics.sequence_labeling import get_entities

    out = []
    for z, meta in zip(logits, features.meta):
        ex = examples[meta["example"]]
        tags = ["O"] * len(ex.tokens)
        ids = z.argmax(-1)
        seen = set()
        for pos, w in enumerate(meta["word_ids"]):
            if w is not None and w not in seen:
                seen.add(w)
                tags[w] = labels[int(ids[pos])]
        entities = [
            {"type": t, "start": s, "end": e + 1, "text": " ".join(ex.tokens[s : e + 1])}
            for t, s, e in get_entities(tags)
        ]
        out.append({"tokens": list(ex.tokens), "tags": tags, "entities": entities})
    return out


def decode_qa(
    logits: Sequence[tuple[np.ndarray, np.ndarray]],
    features: Features,
    examples: Sequence[QAExample],
    *,
    version_2: bool = False,
    max_answer_length: int = 30,
    n_best: int = 20,
) -> list[dict]:
    """Answer spans through `debertakit.evaluate.squad.postprocess_qa` (all windows of an example, exact band
    search); `start`/`end` are character offsets into the context, leading/trailing spaces trimmed."""
    from debertakit.evaluate.squad import postprocess_qa

    offsets = [m["offsets"] for m in features.meta]
    preds = postprocess_qa(
        [s for s, _ in logits],
        [e for _, e in logits],
        offsets,
        [[o is not None for o in off] for off in offsets],
        [m["example"] for m in features.meta],
        [ex.context for ex in examples],
        n_best=n_best,
        max_answer_length=max_answer_length,
        null_index=0 if version_2 else None,
    )
    out = []
    for ex, p in zip(examples, preds):
        start, end, text = p.start, p.end, p.text
        if text:  # SentencePiece offsets include the space before a word; the answer does not
            start += len(text) - len(text.lstrip())
            end -= len(text) - len(text.rstrip())
            text = ex.context[start:end]
        prob = p.n_best[0].probability if p.n_best and text else 0.0
        rec = {"id": ex.id, "answer": text, "start": start, "end": end, "score": float(prob)}
        if version_2:
            rec["null_score_diff"] = None if math.isnan(p.null_score_diff) else float(p.null_score_diff)
        out.append(rec)
    return out


def decode(
    kind: str,
    logits: Sequence[Any],
    features: Features,
    examples: Sequence[Any],
    labels: Sequence[str] | None,
    *,
    version_2: bool = False,
) -> list[dict]:
    """One prediction dict per example (see the `decode_*` functions)."""
    if kind == "ner":
        return decode_ner(logits, features, examples, labels)
    if kind == "qa":
        return decode_qa(logits, features, examples, version_2=version_2)
    return decode_sequences(logits, kind, labels)


def score_predictions(
    task: str, kind: str, predictions: Sequence[dict], examples: Sequence[Any], labels: Sequence[str] | None
) -> dict[str, float]:
    """The task's metrics (`debertakit.evaluate.metrics.task_metrics`) of decoded predictions."""
    from debertakit.evaluate.metrics import task_metrics
    from debertakit.evaluate.squad import squad_evaluate

    spec = get_task(task)
    if kind == "qa":
        answers = {p["id"]: p["answer"] for p in predictions}
        if spec.name == "squad_v2":
            na = {p["id"]: p["null_score_diff"] for p in predictions}
            scores = squad_evaluate(examples, answers, na_probs=na)
            return {k: v for k, v in scores.items() if k in spec.metrics}
        return task_metrics(task, answers, examples)
    if kind == "ner":
        return task_metrics(task, [p["tags"] for p in predictions], [list(e.tags) for e in examples])
    if kind == "regression":
        return task_metrics(task, [p["score"] for p in predictions], [float(e.label) for e in examples])
    return task_metrics(task, [p["label_id"] for p in predictions], [int(e.label) for e in examples])


# ------------------------------------------------------------------------------------------------ model + task
@dataclass
class TaskInfo:
    """What `task.json` holds next to a fine-tuned model."""

    task: str
    kind: str
    labels: list[str] | None = None
    max_length: int | None = None
    doc_stride: int = 128

    def save(self, directory: str | Path) -> None:
        from debertakit.convert.checkpoint import atomic_write_text

        atomic_write_text(Path(directory) / TASK_FILE, json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> TaskInfo | None:
        path = Path(directory) / TASK_FILE
        return cls(**json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None


class Predictor:
    """A fine-tuned model with its tokenizer and task: `predictor.predict(examples)` -> one dict per example.

    Args:
        model: a model directory written by `debertakit finetune` (`best/`), or any Hugging Face-format
            DeBERTa directory with tokenizer files when `task` is given.
        task: task name (default: from `task.json`).
        tokenizer: tokenizer directory (default: the model directory).
        device: "auto", "cpu", "cuda", ...
        batch_size: rows per forward pass.
        dtype: the model's weights and activations: "float32", "bfloat16" or "float16" (on a GPU the 16-bit
            ones are faster, and rounded: probabilities differ from float32's in their second or third digit).
        cuda_graphs: replay the forward as CUDA graphs, one per bucket of batch sizes and lengths
            (`debertakit.inference.graphs.CudaGraphModel`): for small batches, whose time the host sets. Needs
            a CUDA device.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        task: str | None = None,
        tokenizer: str | Path | None = None,
        device: str = "auto",
        batch_size: int = 64,
        dtype: str = "float32",
        cuda_graphs: bool = False,
    ):
        from debertakit.convert.checkpoint import load_pretrained
        from debertakit.tokenization import load_tokenizer
        from debertakit.train.distributed import pick_device

        info = TaskInfo.load(model)
        if info is None and task is None:
            raise ValueError(f"{model} has no {TASK_FILE}; pass the task name (e.g. task='sst2')")
        if info is None or (task is not None and get_task(task).name != info.task):
            spec = get_task(task)
            info = TaskInfo(spec.name, spec.kind, list(spec.labels) if spec.labels else None)
        self.info = info
        self.device = pick_device(device)
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}; expected one of {sorted(DTYPES)}")
        self.model = load_pretrained(model, HEADS[info.kind]).to(self.device, DTYPES[dtype]).eval()
        if cuda_graphs:
            from debertakit.inference.graphs import CudaGraphModel

            if self.device.type != "cuda":
                raise ValueError(f"cuda_graphs=True needs a CUDA device; the model runs on {self.device}")
            self.model = CudaGraphModel(self.model)
        if info.labels is None and self.model.cfg.label_names:
            info.labels = list(self.model.cfg.label_names)
        self.tokenizer = load_tokenizer(tokenizer or model)
        self.batch_size = batch_size

    def features(self, examples: Sequence[Any]) -> Features:
        return featurize(
            self.info.kind,
            examples,
            self.tokenizer,
            labels=self.info.labels,
            max_length=self.info.max_length,
            stride=self.info.doc_stride,
            with_targets=False,
        )

    def predict(self, examples: Sequence[Any], *, progress: bool = False) -> list[dict]:
        """Predictions for task records (`TextExample`, `TokenExample`, `QAExample`, `ChoiceExample`)."""
        feats = self.features(examples)
        logits = run_model(
            self.model,
            feats,
            batch_size=self.batch_size,
            pad_token_id=self.tokenizer.pad_token_id,
            device=self.device,
            progress=progress,
        )
        return decode(
            self.info.kind,
            logits,
            feats,
            examples,
            self.info.labels,
            version_2=self.info.task == "squad_v2",
        )


# ----------------------------------------------------------------------------------------------------- pipeline
class Pipeline:
    """`pipeline("classify" | "extract" | "answer", model=DIR)`: call it on raw text.

    * classify: `clf("a sentence")`, `clf(["one", "two"])`, `clf(("premise", "hypothesis"))` or a list of pairs
      -> `{"label", "label_id", "score", "probabilities"}` (regression models: `{"score"}`).
    * extract (NER): `ner("John lives in Berlin")` (split on whitespace) or a list of words, or a list of those
      -> `{"tokens", "tags", "entities": [{"type", "start", "end", "text"}]}`.
    * answer (QA): `qa(question="...", context="...")`, or lists of both -> `{"answer", "start", "end", "score"}`.

    A single input gives a single dict, a list gives a list.
    """

    KINDS = {"classify": ("classification", "regression"), "extract": ("ner",), "answer": ("qa",)}

    def __init__(self, name: str, predictor: Predictor):
        if name not in self.KINDS:
            raise ValueError(f"unknown pipeline {name!r}; expected one of {sorted(self.KINDS)}")
        if predictor.info.kind not in self.KINDS[name]:
            raise ValueError(
                f"pipeline {name!r} needs a {' or '.join(self.KINDS[name])} model; "
                f"the model was fine-tuned for {predictor.info.task} ({predictor.info.kind})"
            )
        self.name, self.predictor = name, predictor

    def __call__(self, inputs: Any = None, *, question: Any = None, context: Any = None) -> Any:
        if self.name == "answer":
            return self._answer(question, context)
        if self.name == "extract":
            single = isinstance(inputs, str) or (
                isinstance(inputs, (list, tuple)) and all(isinstance(w, str) for w in inputs) and inputs
            )
            items = [inputs] if single else list(inputs)
            words = [x.split() if isinstance(x, str) else list(x) for x in items]
            examples = [TokenExample(str(i), tuple(w), ("O",) * len(w)) for i, w in enumerate(words)]
        else:
            single = isinstance(inputs, str) or (
                isinstance(inputs, tuple) and len(inputs) == 2 and all(isinstance(t, str) for t in inputs)
            )
            items = [inputs] if single else list(inputs)
            examples = [
                TextExample(str(i), *(x if isinstance(x, tuple) else (x, None))) for i, x in enumerate(items)
            ]
        out = self.predictor.predict(examples)
        return out[0] if single else out

    def _answer(self, question: Any, context: Any) -> Any:
        if question is None or context is None:
            raise ValueError("the answer pipeline needs question= and context=")
        single = isinstance(question, str)
        qs = [question] if single else list(question)
        cs = [context] * len(qs) if isinstance(context, str) else list(context)
        if len(qs) != len(cs):
            raise ValueError(f"{len(qs)} questions and {len(cs)} contexts; expected one context per question")
        examples = [QAExample(str(i), q, c, ()) for i, (q, c) in enumerate(zip(qs, cs))]
        out = [{k: v for k, v in p.items() if k != "id"} for p in self.predictor.predict(examples)]
        return out[0] if single else out


def pipeline(name: str, model: str | Path, **kwargs: Any) -> Pipeline:
    """A ready-to-call pipeline over a fine-tuned model directory (see `Pipeline`); `kwargs` go to `Predictor`."""
    return Pipeline(name, Predictor(model, **kwargs))


# ------------------------------------------------------------------------------------------------------ writing
def write_predictions(path: str | Path, records: Sequence[dict]) -> Path:
    """JSON lines (`.jsonl`, `.json`) or CSV (`.csv`, `.tsv`; nested values as JSON) by the file extension."""
    from debertakit.convert.checkpoint import atomic_write_text

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    elif suffix in (".csv", ".tsv"):
        import io

        columns: list[str] = []
        for r in records:
            columns += [k for k in r if k not in columns]
        buf = io.StringIO()
        writer = csv.DictWriter(
            buf, columns, delimiter="\t" if suffix == ".tsv" else ",", lineterminator="\n"
        )
        writer.writeheader()
        for r in records:
            writer.writerow(
                {
                    k: json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v
                    for k, v in r.items()
                }
            )
        text = buf.getvalue()
    else:
        raise ValueError(f"{path}: unknown extension {suffix!r}; expected .jsonl, .json, .csv or .tsv")
    atomic_write_text(path, text)
    return path


def _with_ids(records: Sequence[dict], examples: Sequence[Any]) -> list[dict]:
    out = []
    for ex, r in zip(examples, records):
        key = getattr(ex, "guid", None) or getattr(ex, "id", None)
        out.append({"id": key, **{k: v for k, v in r.items() if k != "id"}})
    return out


def predict(
    *,
    model: str,
    input: str,
    out: str,
    task: str | None = None,
    tokenizer: str | None = None,
    batch_size: int = 64,
    device: str = "auto",
    skip_bad: bool = False,
    progress: bool = True,
    dtype: str = "float32",
    cuda_graphs: bool = False,
) -> None:
    """Predict labels and probabilities, scores, answer spans or entities for a file, in batches.

    Args:
        model: a fine-tuned model directory (`best/` of a `debertakit finetune` run).
        input: a file in the task's format (read by the task's reader; labels may be absent).
        out: predictions file: JSON lines (.jsonl) or CSV (.csv / .tsv), one record per example.
        task: task name (default: the one the model was fine-tuned for).
        tokenizer: tokenizer directory (default: the model directory).
        batch_size: rows per forward pass.
        device: "auto", "cpu", "cuda", ...
        skip_bad: skip malformed rows of the input (counted) instead of stopping.
        progress: show a progress bar.
        dtype: the model's weights and activations: "float32", "bfloat16" or "float16" (see `Predictor`).
        cuda_graphs: replay the forward as CUDA graphs (see `Predictor`; a CUDA device only).
    """
    running = dict(device=device, batch_size=batch_size, dtype=dtype, cuda_graphs=cuda_graphs)
    predictor = Predictor(model, task=task, tokenizer=tokenizer, **running)
    data = get_task(predictor.info.task).read(input, skip_bad=skip_bad)
    records = _with_ids(predictor.predict(data.examples, progress=progress), data.examples)
    write_predictions(out, records)
    print(f"{len(records)} predictions ({predictor.info.task}) -> {out}")
