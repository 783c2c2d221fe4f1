"""Featurisation of task records and the dynamic-padding collator, on the shared data sets."""

from __future__ import annotations

import pytest
import torch

from debertakit.data.features import Collator, batch_indices, featurize
from debertakit.data.tasks import ChoiceExample, QAExample, TextExample, read_task
from debertakit.evaluate.squad import normalize_answer


def test_sentence_pairs_and_labels(shared_data, task_tokenizer):
    tok = task_tokenizer
    data = read_task("rte", shared_data / "glue/RTE/dev.tsv")
    feats = featurize("classification", data.examples[:20], tok, max_length=64)
    assert len(feats) == 20 and feats.kind == "classification"
    for row, ex in zip(feats.inputs, data.examples[:20]):
        ids = row["input_ids"]
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and len(ids) <= 64
        assert ids.count(tok.sep_token_id) == 2  # [CLS] A [SEP] B [SEP]
        assert row["labels"] == ex.label and isinstance(row["labels"], int)
        assert row["attention_mask"] == [1] * len(ids)
    assert feats.truncated == sum(len(tok(e.text, e.text_pair)["input_ids"]) > 64 for e in data.examples[:20])


def test_regression_labels_are_floats(shared_data, task_tokenizer):
    data = read_task("stsb", shared_data / "glue/STS-B/dev.tsv")
    feats = featurize("regression", data.examples[:5], task_tokenizer)
    assert [r["labels"] for r in feats.inputs] == [float(e.label) for e in data.examples[:5]]
    batch = Collator(task_tokenizer.pad_token_id)(feats.inputs)
    assert batch["labels"].dtype == torch.float32


def test_mixed_single_and_pair_is_an_error(task_tokenizer):
    with pytest.raises(ValueError, match="b: mixes"):
        featurize(
            "classification", [TextExample("a", "x", "y", 0), TextExample("b", "x", None, 1)], task_tokenizer
        )


def test_squad_windows_hold_the_answer(shared_data, task_tokenizer):
    tok = task_tokenizer
    data = read_task("squad", shared_data / "squad/dev-v1.1-part1.json")
    examples = data.examples[:60]
    feats = featurize("qa", examples, tok, max_length=96, stride=24)
    assert len(feats) > len(examples)  # long contexts give several windows
    found = set()
    for row, meta in zip(feats.inputs, feats.meta):
        ex = examples[meta["example"]]
        offsets = meta["offsets"]
        assert len(row["input_ids"]) <= 96
        ctx = [i for i, o in enumerate(offsets) if o is not None]
        assert row["input_ids"][: ctx[0]].count(tok.sep_token_id) == 1  # [CLS] question [SEP] context
        s, e = row["start_positions"], row["end_positions"]
        if s == 0:
            assert e == 0
            lo, hi = offsets[ctx[0]][0], offsets[ctx[-1]][1]
            assert not (lo <= ex.answers[0].start and ex.answers[0].end <= hi)
            continue
        assert s in ctx and e in ctx and s <= e
        span = ex.context[offsets[s][0] : offsets[e][1]]
        assert normalize_answer(ex.answers[0].text) in normalize_answer(span)
        found.add(meta["example"])
    assert len(found) >= 55  # almost every answer fits in some window
    # consecutive windows of one example share `stride` context tokens
    by_example = {}
    for row, meta in zip(feats.inputs, feats.meta):
        by_example.setdefault(meta["example"], []).append(
            [row["input_ids"][i] for i, o in enumerate(meta["offsets"]) if o is not None]
        )
    first, second = next(w for w in by_example.values() if len(w) > 1)[:2]
    assert first[-24:] == second[:24]


def test_squad_unanswerable_and_long_question(task_tokenizer):
    ex = QAExample("q", "why " * 200, "The context is short.", (), is_impossible=True)
    feats = featurize("qa", [ex], task_tokenizer, max_length=64, stride=8)
    assert feats.inputs[0]["start_positions"] == 0 == feats.inputs[0]["end_positions"]
    assert len(feats.inputs[0]["input_ids"]) <= 64
    with pytest.raises(ValueError, match="stride 60"):
        featurize("qa", [ex], task_tokenizer, max_length=96, stride=60)


def test_ner_labels_sit_on_first_subtokens(shared_data, task_tokenizer):
    data = read_task("conll2003", shared_data / "conll2003/eng.testa")
    examples = data.examples[:40]
    feats = featurize("ner", examples, task_tokenizer, labels=data.labels, max_length=128)
    for row, meta, ex in zip(feats.inputs, feats.meta, examples):
        word_ids = meta["word_ids"]
        labelled = [(w, lab) for w, lab in zip(word_ids, row["labels"]) if lab != -100]
        assert [w for w, _ in labelled] == list(range(len(ex.tokens)))  # one label per word, in order
        assert [data.labels[lab] for _, lab in labelled] == list(ex.tags)
        firsts = {word_ids.index(w) for w in set(word_ids) if w is not None}
        assert {i for i, lab in enumerate(row["labels"]) if lab != -100} == firsts
    assert feats.truncated == 0
    with pytest.raises(ValueError, match="'B-XYZ'"):
        featurize("ner", [type(examples[0])("g", ("a",), ("B-XYZ",))], task_tokenizer, labels=data.labels)


def test_multiple_choice_rows(task_tokenizer):
    examples = [
        ChoiceExample(
            "a", "A man sits down.", "He", ("eats.", "flies away over the sea.", "sleeps.", "reads."), 2
        ),
        ChoiceExample("b", "", "Which is red?", ("blood", "grass", "sky", "snow"), 0),
    ]
    feats = featurize("multiple_choice", examples, task_tokenizer)
    batch = Collator(task_tokenizer.pad_token_id)(feats.inputs)
    assert batch["input_ids"].shape[:2] == (2, 4) and batch["labels"].tolist() == [2, 0]
    assert batch["attention_mask"].shape == batch["input_ids"].shape


def test_collator_pads_to_the_longest():
    rows = [
        {"input_ids": [1, 5, 6, 2], "attention_mask": [1] * 4, "labels": [-100, 3, 4, -100]},
        {"input_ids": [1, 7, 2], "attention_mask": [1] * 3, "labels": [-100, 1, -100]},
    ]
    batch = Collator(pad_token_id=0)(rows)
    assert batch["input_ids"].tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["labels"].tolist()[1] == [-100, 1, -100, -100]
    assert Collator(0, pad_to_multiple_of=8)(rows)["input_ids"].shape == (2, 8)


def test_batch_indices_cover_every_row_once_and_group_lengths():
    lengths = [(i * 37) % 101 for i in range(400)]
    plain = batch_indices(lengths, 16, seed=3)
    grouped = batch_indices(lengths, 16, seed=3, group_by_length=True)
    for batches in (plain, grouped):
        assert sorted(i for b in batches for i in b) == list(range(400))
    assert batch_indices(lengths, 16, seed=3) == plain  # a function of the seed
    assert batch_indices(lengths, 16, seed=4) != plain

    def padding(batches):
        return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)

    assert padding(grouped) < padding(plain) / 4
    assert batch_indices(lengths, 16, shuffle=False)[0] == list(range(16))
