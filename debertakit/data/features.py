"""Task records -> model inputs, and the collator that pads them into batches.

`featurize(kind, examples, tokenizer, ...)` turns the records of a task reader into `Features`: one dict of
model inputs per row (plain Python lists, unpadded) and, beside it, what post-processing needs (the example a
SQuAD window belongs to and its offsets, the word of each NER token). `Collator` pads a list of rows to the
longest in the batch (dynamic padding) and makes tensors; `batch_indices` gives the order of the rows in an
epoch, optionally grouped by length so that batches hold rows of similar length.

* Sentences and pairs (GLUE): ``[CLS] A [SEP] (B [SEP])``, truncated longest-first; the label is a class id or,
  for regression, a float.
* SQuAD: question + context windows with overflow and stride (the question is never cut by truncation; a
  question longer than `max_query_length` tokens is shortened first). `start_positions` / `end_positions` are
  the tokens of the answer in the window, or the [CLS] index 0 when the answer is not inside the window (and
  for unanswerable questions), as in BERT's and DeBERTa's SQuAD recipes.
* NER: the words are tokenized as given (`is_split_into_words`); the first sub-token of each word carries the
  word's tag, every other token -100 (not a target).
* Multiple choice: one row per question with `input_ids` of shape (choices, N): ``[CLS] context [SEP]
  question choice [SEP]`` for each choice.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from debertakit.data.tasks.records import ChoiceExample, QAExample, TextExample, TokenExample
from debertakit.objectives.losses import IGNORE_INDEX

MODEL_KEYS = ("input_ids", "token_type_ids", "attention_mask")
LABEL_KEYS = ("labels", "start_positions", "end_positions")


@dataclass
class Features:
    """Featurised rows of one file.

    Attributes:
        kind: the task kind ("classification", "regression", "qa", "ner", "multiple_choice").
        inputs: one dict per row: `input_ids`, `token_type_ids`, `attention_mask` (lists; (choices, N) lists
            for multiple choice) and the targets when the examples have them (`labels`, or `start_positions`
            and `end_positions`).
        meta: one dict per row with what post-processing needs: `example` (index of the record the row comes
            from) and, for QA, `offsets` (token -> (start, end) in the context, None outside the context); for
            NER, `word_ids` (token -> word index or None).
        num_examples: number of records featurised (QA rows are windows: there may be more rows than records).
    """

    kind: str
    inputs: list[dict[str, Any]]
    meta: list[dict[str, Any]]
    num_examples: int
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.inputs)

    def lengths(self) -> list[int]:
        """Tokens per row (for multiple choice: of the longest choice)."""
        out = []
        for row in self.inputs:
            ids = row["input_ids"]
            out.append(max(len(c) for c in ids) if ids and isinstance(ids[0], list) else len(ids))
        return out


def _check_max_length(max_length: int) -> None:
    if not isinstance(max_length, int) or max_length < 8:
        raise ValueError(f"max_length {max_length!r}; expected an int >= 8")


# ----------------------------------------------------------------------------------------------- sentences
def featurize_text(
    examples: Sequence[TextExample], tokenizer: Any, *, max_length: int = 128, regression: bool = False
) -> Features:
    """Sentences or sentence pairs -> rows with `labels` (class id, or float for regression) when labelled."""
    _check_max_length(max_length)
    if not examples:
        return Features("regression" if regression else "classification", [], [], 0)
    pairs = [e.text_pair for e in examples]
    has_pair = [p is not None for p in pairs]
    if any(has_pair) and not all(has_pair):
        i = has_pair.index(False) if has_pair[0] else has_pair.index(True)
        raise ValueError(
            f"example {examples[i].guid}: mixes single sentences and pairs; expected one or the other per file"
        )
    enc = tokenizer(
        [e.text for e in examples],
        pairs if has_pair[0] else None,
        truncation=True,
        max_length=max_length,
        return_length=True,
    )
    full = tokenizer(
        [e.text for e in examples], pairs if has_pair[0] else None, truncation=False, return_length=True
    )
    truncated = sum(a < b for a, b in zip(enc["length"], full["length"]))
    rows, meta = [], []
    for i, e in enumerate(examples):
        row = {k: enc[k][i] for k in MODEL_KEYS}
        if e.label is not None:
            row["labels"] = float(e.label) if regression else int(e.label)
        rows.append(row)
        meta.append({"example": i})
    return Features("regression" if regression else "classification", rows, meta, len(examples), truncated)


# ---------------------------------------------------------------------------------------------------- SQuAD
def _shorten_question(question: str, tokenizer: Any, max_query_length: int) -> str:
    enc = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= max_query_length:
        return question
    return question[: offsets[max_query_length - 1][1]]


def featurize_qa(
    examples: Sequence[QAExample],
    tokenizer: Any,
    *,
    max_length: int = 384,
    stride: int = 128,
    max_query_length: int | None = None,
    with_positions: bool = True,
) -> Features:
    """Question + context -> overlapping windows of at most `max_length` tokens sharing `stride` tokens.

    Args:
        examples: SQuAD records.
        tokenizer: a tokenizer with `return_overflowing_tokens` / `return_offsets_mapping` (`load_tokenizer`).
        max_length: tokens per window, special tokens and question included.
        stride: tokens of context that consecutive windows share.
        max_query_length: questions longer than this many tokens are shortened to it; default 64, or half the
            window when that is smaller.
        with_positions: add `start_positions` / `end_positions` from the first gold answer (0 = [CLS] when the
            answer is not inside the window or the question has none).
    """
    _check_max_length(max_length)
    if max_query_length is None:
        max_query_length = min(64, (max_length - tokenizer.num_special_tokens_pair) // 2)
    if max_query_length < 1:
        raise ValueError(f"max_query_length {max_query_length}; expected >= 1")
    questions = [_shorten_question(e.question.lstrip(), tokenizer, max_query_length) for e in examples]
    if not examples:
        return Features("qa", [], [], 0)
    budget = max_length - tokenizer.num_special_tokens_pair - max_query_length
    if stride >= budget:
        raise ValueError(
            f"stride {stride} must be smaller than the context tokens of a window ({budget} = max_length "
            f"{max_length} - {tokenizer.num_special_tokens_pair} special tokens - max_query_length {max_query_length})"
        )
    enc = tokenizer(
        questions,
        [e.context for e in examples],
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    rows, meta = [], []
    for w, ex in enumerate(enc["overflow_to_sample_mapping"]):
        seq = enc.sequence_ids(w)
        offsets = [tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][w], seq)]
        row = {k: enc[k][w] for k in MODEL_KEYS}
        if with_positions:
            row["start_positions"], row["end_positions"] = _answer_tokens(examples[ex], offsets)
        rows.append(row)
        meta.append({"example": ex, "offsets": offsets})
    windows = [m["example"] for m in meta]
    split = sum(windows.count(i) > 1 for i in set(windows))  # examples whose context needed several windows
    return Features("qa", rows, meta, len(examples), split)


def _answer_tokens(example: QAExample, offsets: list[tuple[int, int] | None]) -> tuple[int, int]:
    """Token indices of the first gold answer inside the window, or (0, 0) (the [CLS] token) when outside."""
    if example.is_impossible or not example.answers:
        return 0, 0
    answer = example.answers[0]
    ctx = [i for i, o in enumerate(offsets) if o is not None]
    if not ctx or offsets[ctx[0]][0] > answer.start or offsets[ctx[-1]][1] < answer.end:
        return 0, 0
    start = next(i for i in ctx if offsets[i][1] > answer.start)
    end = next(i for i in reversed(ctx) if offsets[i][0] < answer.end)
    return start, max(start, end)


# ------------------------------------------------------------------------------------------------------ NER
def featurize_ner(
    examples: Sequence[TokenExample],
    tokenizer: Any,
    labels: Sequence[str],
    *,
    max_length: int = 256,
    with_labels: bool = True,
) -> Features:
    """Words + tags -> rows whose `labels` hold each word's tag id on its first sub-token and -100 elsewhere.

    Words beyond `max_length` tokens are cut (their predictions default to "O"; `Features.truncated` counts
    the sentences cut).
    """
    _check_max_length(max_length)
    index = {name: i for i, name in enumerate(labels)}
    if not examples:
        return Features("ner", [], [], 0)
    enc = tokenizer(
        [list(e.tokens) for e in examples], is_split_into_words=True, truncation=True, max_length=max_length
    )
    rows, meta, truncated = [], [], 0
    for i, e in enumerate(examples):
        word_ids = enc.word_ids(i)
        row = {k: enc[k][i] for k in MODEL_KEYS}
        seen = {w for w in word_ids if w is not None}
        truncated += len(seen) < len(e.tokens)
        if with_labels:
            tags = []
            for tag in e.tags:
                if tag not in index:
                    raise ValueError(
                        f"sentence {e.guid}: tag {tag!r} is not one of the labels {list(labels)}"
                    )
                tags.append(index[tag])
            prev = None
            row["labels"] = []
            for w in word_ids:
                row["labels"].append(tags[w] if w is not None and w != prev else IGNORE_INDEX)
                prev = w
        rows.append(row)
        meta.append({"example": i, "word_ids": word_ids, "num_words": len(e.tokens)})
    return Features("ner", rows, meta, len(examples), truncated)


# ------------------------------------------------------------------------------------------ multiple choice
def featurize_choice(examples: Sequence[ChoiceExample], tokenizer: Any, *, max_length: int = 256) -> Features:
    """One row per question: `input_ids` etc. of shape (choices, N), `labels` the gold choice."""
    _check_max_length(max_length)
    rows, meta = [], []
    n_choices = {len(e.choices) for e in examples}
    if len(n_choices) > 1:
        raise ValueError(
            f"questions with different numbers of choices {sorted(n_choices)}; expected one number"
        )
    truncated = 0
    for i, e in enumerate(examples):
        seconds = [f"{e.question} {c}".strip() for c in e.choices]
        firsts = [e.context] * len(seconds)
        enc = tokenizer(firsts, seconds, truncation=True, max_length=max_length, return_length=True)
        truncated += any(n >= max_length for n in enc["length"])
        row = {k: enc[k] for k in MODEL_KEYS}
        if e.label is not None:
            row["labels"] = int(e.label)
        rows.append(row)
        meta.append({"example": i})
    return Features("multiple_choice", rows, meta, len(examples), truncated)


def featurize(
    kind: str,
    examples: Sequence[Any],
    tokenizer: Any,
    *,
    labels: Sequence[str] | None = None,
    max_length: int | None = None,
    stride: int = 128,
    with_targets: bool = True,
) -> Features:
    """Dispatch on the task kind (`debertakit.data.tasks.TaskSpec.kind`); `max_length` defaults to 128 for
    sentences, 384 for QA, 256 for NER and multiple choice."""
    if kind in ("classification", "regression"):
        return featurize_text(
            examples, tokenizer, max_length=max_length or 128, regression=kind == "regression"
        )
    if kind == "qa":
        return featurize_qa(
            examples, tokenizer, max_length=max_length or 384, stride=stride, with_positions=with_targets
        )
    if kind == "ner":
        if labels is None:
            raise ValueError("NER featurisation needs the label names (the tag set)")
        return featurize_ner(
            examples, tokenizer, labels, max_length=max_length or 256, with_labels=with_targets
        )
    if kind == "multiple_choice":
        return featurize_choice(examples, tokenizer, max_length=max_length or 256)
    raise ValueError(
        f"unknown task kind {kind!r}; expected classification, regression, qa, ner or multiple_choice"
    )


# --------------------------------------------------------------------------------------------------- batches
@dataclass
class Collator:
    """Pads a list of rows to the longest row of the batch and returns tensors.

    `input_ids` are padded with `pad_token_id`, `attention_mask` and `token_type_ids` with 0, token `labels`
    with -100. Rows of multiple choice ((choices, N) lists) give (B, choices, N). Regression labels become
    float32, class labels int64. Keys other than the model inputs and targets are ignored.

    Args:
        pad_token_id: the tokenizer's [PAD] id.
        pad_to_multiple_of: round the padded length up to a multiple of this (e.g. 8 for tensor cores).
    """

    pad_token_id: int = 0
    pad_to_multiple_of: int | None = None
    _pads: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pads = {
            "input_ids": self.pad_token_id,
            "token_type_ids": 0,
            "attention_mask": 0,
            "labels": IGNORE_INDEX,
        }

    def _target(self, rows: list[list[int]]) -> int:
        n = max(len(r) for r in rows)
        m = self.pad_to_multiple_of
        return -(-n // m) * m if m else n

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("cannot collate an empty batch")
        batch: dict[str, torch.Tensor] = {}
        for key in MODEL_KEYS + LABEL_KEYS:
            if key not in rows[0]:
                continue
            values = [r[key] for r in rows]
            if not isinstance(values[0], list):  # one number per row
                dtype = torch.float32 if isinstance(values[0], float) else torch.long
                batch[key] = torch.tensor(values, dtype=dtype)
                continue
            nested = isinstance(values[0][0], list)  # multiple choice: (choices, N) per row
            flat = [c for v in values for c in v] if nested else values
            n = self._target(flat)
            pad = self._pads[key]
            padded = torch.tensor([c + [pad] * (n - len(c)) for c in flat], dtype=torch.long)
            batch[key] = padded.view(len(rows), -1, n) if nested else padded
        return batch


def batch_indices(
    lengths: Sequence[int],
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    group_by_length: bool = False,
    mega_batch: int = 50,
) -> list[list[int]]:
    """The batches of one epoch, as lists of row indices; a pure function of its arguments (exact resume).

    With `group_by_length`, the shuffled rows are cut into groups of `mega_batch` batches and each group is
    sorted by length (longest first) before being split into batches, so batches waste little padding while
    the order of batches stays random.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size}; expected >= 1")
    order = list(range(len(lengths)))
    rng = random.Random(seed)
    if shuffle:
        rng.shuffle(order)
    if group_by_length:
        size = batch_size * mega_batch
        order = [
            i
            for start in range(0, len(order), size)
            for i in sorted(order[start : start + size], key=lambda j: -lengths[j])
        ]
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if group_by_length and shuffle:
        rng.shuffle(batches)
    return batches
