"""Task readers: the real files of ../shared/data (counts from its README and independent shell counts),
malformed rows (error naming file and line, or skipped and counted), and the registry."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest

from debertakit.data.tasks import (
    CONLL2003_LABELS,
    TASKS,
    MalformedRowError,
    QAExample,
    get_task,
    iob1_to_iob2,
    read_conll,
    read_glue,
    read_multiple_choice,
    read_squad,
    read_task,
    read_text_pairs,
)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data folder {DATA} not present")


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


# ---------------------------------------------------------------- real data


# (task, file, rows, count of label 0, count of label 1); label counts from `cut | sort | uniq -c`.
GLUE_FILES = [
    ("sst2", "SST-2/train.tsv", 67_349, 29_780, 37_569),
    ("sst2", "SST-2/dev.tsv", 872, 428, 444),
    ("cola", "CoLA/train.tsv", 8_551, 2_528, 6_023),
    ("cola", "CoLA/dev.tsv", 1_043, 324, 719),
    ("mrpc", "MRPC/msr_paraphrase_train.txt", 4_076, 1_323, 2_753),
    ("mrpc", "MRPC/msr_paraphrase_test.txt", 1_725, 578, 1_147),
    ("rte", "RTE/train.tsv", 2_490, 1_249, 1_241),
    ("rte", "RTE/dev.tsv", 277, 146, 131),
]


@needs_data
@pytest.mark.parametrize("task, file, rows, zeros, ones", GLUE_FILES)
def test_glue_real_files(task, file, rows, zeros, ones):
    data = read_task(task, DATA / "glue" / file)
    assert len(data) == rows and data.skipped == 0
    assert Counter(e.label for e in data) == {0: zeros, 1: ones}
    assert all(e.text and "\t" not in e.text and not e.text.startswith("\ufeff") for e in data)
    assert data.labels == get_task(task).labels
    if task in ("mrpc", "rte"):
        assert all(e.text_pair for e in data)


@needs_data
def test_glue_real_file_contents():
    cola = read_glue(DATA / "glue/CoLA/train.tsv", "cola")
    assert cola[0].text == "Our friends won't buy this analysis, let alone the next one we propose."
    # Sentences with quotes are not taken for CSV quoting.
    assert any(e.text == 'Susan whispered "Shut up".' for e in cola)
    mrpc = read_glue(DATA / "glue/MRPC/msr_paraphrase_train.txt", "mrpc")
    assert mrpc[0].text.startswith("Amrozi accused his brother") and mrpc[0].label == 1
    rte = read_glue(DATA / "glue/RTE/dev.tsv", "rte")
    assert (
        rte[0].guid == "0" and rte[0].text_pair == "Christopher Reeve had an accident." and rte[0].label == 1
    )


@needs_data
@pytest.mark.parametrize("file, rows", [("train.tsv", 5_749), ("dev.tsv", 1_500)])
def test_stsb_real_files(file, rows):
    data = read_task("STS-B", DATA / "glue/STS-B" / file)
    assert len(data) == rows and data.labels is None
    assert all(isinstance(e.label, float) and 0 <= e.label <= 5 for e in data)
    if file == "dev.tsv":  # sum of the score column by awk: 3545.86
        assert sum(e.label for e in data) == pytest.approx(3545.86)
        assert (data[0].text, data[0].text_pair, data[0].label) == (
            "A man with a hard hat is dancing.",
            "A man wearing a hard hat is dancing.",
            5.0,
        )


@needs_data
def test_squad_real_file():
    data = read_squad(DATA / "squad/dev-v1.1-part1.json")
    assert len(data) == 4_961 and data.skipped == 0
    assert sum(len(e.answers) for e in data) == 17_778
    assert len({e.title for e in data}) == 24
    first = data[0]
    assert isinstance(first, QAExample) and not first.is_impossible
    assert first.question == "Which NFL team represented the AFC at Super Bowl 50?"
    assert {a.text for a in first.answers} == {"Denver Broncos"}
    for e in data:
        assert all(e.context[a.start : a.end] == a.text for a in e.answers)


@needs_data
@pytest.mark.parametrize(
    "file, sentences, tokens, entities, first",
    [
        ("eng.train", 14_041, 203_621, 23_499, ("EU", "rejects", "German")),
        ("eng.testa", 3_250, 51_362, 5_942, ("CRICKET", "-", "LEICESTERSHIRE")),
        ("eng.testb", 3_453, 46_435, 5_648, ("SOCCER", "-", "JAPAN")),
    ],
)
def test_conll_real_files(file, sentences, tokens, entities, first):
    data = read_task("conll2003", DATA / "conll2003" / file)
    assert len(data) == sentences and data.skipped == 0
    assert sum(len(e.tokens) for e in data) == tokens
    assert sum(t.startswith("B-") for e in data for t in e.tags) == entities
    assert data.labels == CONLL2003_LABELS
    assert data[0].tokens[:3] == first and len(data[0].tokens) == len(data[0].tags)


# ---------------------------------------------------------------- GLUE layouts and malformed rows


def test_glue_header_and_headerless_layouts(tmp_path):
    with_header = write(tmp_path, "dev.tsv", "sentence\tlabel\ngood film \t1\nbad film\t0\n")
    without = write(tmp_path, "raw.tsv", "good film\t1\r\nbad film\t0\r\n\n")
    for path in (with_header, without):
        data = read_glue(path, "sst2")
        assert [(e.text, e.label) for e in data] == [("good film", 1), ("bad film", 0)]
    test = write(tmp_path, "test.tsv", "index\tsentence\n0\tsome text\n1\tmore text\n")
    data = read_glue(test, "cola")
    assert [(e.guid, e.text, e.label) for e in data] == [("0", "some text", None), ("1", "more text", None)]


def test_glue_label_names_and_bom(tmp_path):
    rte = write(
        tmp_path,
        "train.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tnot_entailment\n1\tC.\tD.\tentailment\n",
    )
    assert [e.label for e in read_glue(rte, "rte")] == [1, 0]
    mrpc = write(
        tmp_path, "msr.txt", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t1\t2\tA x.\tB y.\n"
    )
    (e,) = read_glue(mrpc, "mrpc")
    assert (e.text, e.text_pair, e.label) == ("A x.", "B y.", 0)
    mnli = write(
        tmp_path,
        "mnli.tsv",
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
        "0\t1\t1e\tgov\t(a)\t(b)\t(a)\t(b)\tP.\tH.\tneutral\tcontradiction\n",
    )
    (e,) = read_task("mnli-mm", mnli)
    assert e.label == get_task("mnli").labels.index("contradiction")  # gold_label, not label1


# One header-less row per (task, number of columns): the columns of the GLUE files, with made-up content.
HEADERLESS = [
    ("qqp", "7\t1\t2\tHow old?\tWhat age?\t1", ("7", "How old?", "What age?", 1)),
    ("qqp", "7\tHow old?\tWhat age?", ("7", "How old?", "What age?", None)),
    (
        "mnli",
        "\t".join(["3", "p", "q", "fiction", "(", "(", "(", "(", "P.", "H.", "neutral", "neutral"]),
        ("3", "P.", "H.", 1),
    ),
    (
        "mnli",
        "\t".join(
            ["3", "p", "q", "g", "(", "(", "(", "(", "P.", "H.", *["neutral"] * 4, "x", "contradiction"]
        ),
        ("3", "P.", "H.", 2),
    ),
    ("mnli", "\t".join(["3", "p", "q", "g", "(", "(", "(", "(", "P.", "H."]), ("3", "P.", "H.", None)),
    ("qnli", "4\tWhy?\tBecause.\tnot_entailment", ("4", "Why?", "Because.", 1)),
    ("wnli", "5\tA.\tB.\t1", ("5", "A.", "B.", 1)),
    ("rte", "6\tA.\tB.\tentailment", ("6", "A.", "B.", 0)),
    ("mrpc", "1\t11\t12\tA.\tB.", ("x.tsv-1", "A.", "B.", 1)),
    ("stsb", "\t".join(["9", "g", "f", "y", "0", "n", "n", "A.", "B.", "2.5"]), ("9", "A.", "B.", 2.5)),
]


@pytest.mark.parametrize("task, row, expected", HEADERLESS)
def test_glue_headerless_layouts(tmp_path, task, row, expected):
    (e,) = read_glue(write(tmp_path, "x.tsv", row + "\n"), task)
    assert (e.guid, e.text, e.text_pair, e.label) == expected


def test_glue_wrong_columns_names_file_and_line(tmp_path):
    path = write(tmp_path, "train.tsv", "sentence\tlabel\nok\t1\nbroken row\n\nfine\t0\n")
    with pytest.raises(MalformedRowError) as err:
        read_glue(path, "sst2")
    assert err.value.line == 3 and err.value.path == str(path)
    assert f"{path}:3:" in str(err.value) and "1 tab-separated columns; expected 2" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_glue_skip_bad_counts_and_logs(tmp_path, caplog):
    path = write(tmp_path, "train.tsv", "a\t1\nb\t7\nc\n\td\t0\ne\t0\n\t1\n")
    with caplog.at_level(logging.WARNING, logger="debertakit.data"):
        data = read_glue(path, "sst2", skip_bad=True)
    assert [e.text for e in data] == ["a", "e"]
    assert data.skipped == 4 and len(data.problems) == 4
    assert "label '7' is not one of" in data.problems[0] and ":2:" in data.problems[0]
    assert ":3:" in data.problems[1] and ":4:" in data.problems[2] and "empty sentence" in data.problems[3]
    assert "skipped 4 malformed row(s)" in caplog.text


def test_glue_first_row_layout_and_bad_utf8(tmp_path):
    # A 3-column first row matches no SST-2 layout.
    with pytest.raises(MalformedRowError, match=r":1: 3 tab-separated columns; expected 2 for sst2"):
        read_glue(write(tmp_path, "x.tsv", "a\tb\tc\n"), "sst2")
    path = write(tmp_path, "y.tsv", b"ok\t1\n\xff\xfe bad\t0\nfine\t0\n")
    with pytest.raises(MalformedRowError, match=r":2: not valid UTF-8"):
        read_glue(path, "sst2")
    assert read_glue(path, "sst2", skip_bad=True).skipped == 1


def test_stsb_scores_checked(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tg\tf\ty\t0\tn\tn\tA.\tB.\t{}\n"
    with pytest.raises(MalformedRowError, match=r":2: score '5.5' outside \[0.0, 5.0\]"):
        read_glue(write(tmp_path, "a.tsv", header + row.format("5.5")), "stsb")
    with pytest.raises(MalformedRowError, match=r":3: score 'high' is not a number"):
        read_glue(write(tmp_path, "b.tsv", header + row.format("1") + row.format("high")), "stsb")


def test_glue_header_without_pair_column(tmp_path):
    with pytest.raises(MalformedRowError, match="no column for the second sentence"):
        read_glue(write(tmp_path, "h.tsv", "sentence1\tlabel\nA\t0\n"), "rte", skip_bad=True)


def test_glue_unknown_task(tmp_path):
    with pytest.raises(ValueError, match="unknown GLUE task 'sst5'"):
        read_glue(write(tmp_path, "a.tsv", "a\t1\n"), "sst5")


# ---------------------------------------------------------------- SQuAD


def squad_doc(qas, context="The cat sat on the mat.", version="v2.0"):
    return json.dumps(
        {"version": version, "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}
    )


def test_squad_v2_and_malformed(tmp_path):
    qas = [
        {
            "id": "q1",
            "question": " Who sat?",
            "answers": [{"text": "The cat", "answer_start": 0}],
            "is_impossible": False,
        },
        {"id": "q2", "question": "Who flew?", "answers": [], "plausible_answers": [], "is_impossible": True},
        {
            "id": "q3",
            "question": "Where?",
            "answers": [{"text": "mat", "answer_start": 3}],
            "is_impossible": False,
        },
    ]
    path = write(tmp_path, "v2.json", squad_doc(qas))
    with pytest.raises(
        MalformedRowError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[2\], id q3\): answer 'mat' at char 3"
    ):
        read_squad(path)
    data = read_squad(path, skip_bad=True)
    assert [e.id for e in data] == ["q1", "q2"] and data.skipped == 1
    assert data[0].question == "Who sat?" and data[0].answers[0].end == 7
    assert data[1].is_impossible and data[1].answers == ()


def test_squad_structure_errors(tmp_path):
    with pytest.raises(MalformedRowError, match=r":2: not valid JSON"):
        read_squad(write(tmp_path, "bad.json", '{"data": [\n  {"title": }]}'))
    with pytest.raises(MalformedRowError, match='expected a JSON object with a "data" list'):
        read_squad(write(tmp_path, "list.json", "[1, 2]"))
    no_answer = [{"id": "q", "question": "Q?", "answers": []}]
    with pytest.raises(MalformedRowError, match="no answers; expected at least one"):
        read_squad(write(tmp_path, "v1.json", squad_doc(no_answer, version="1.1")))


# ---------------------------------------------------------------- CoNLL


def test_conll_docstart_blank_lines_and_labels(tmp_path):
    text = "-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\nPeter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n"
    data = read_conll(write(tmp_path, "eng.x", text))
    assert [e.tokens for e in data] == [("EU", "rejects"), ("Peter", "Blackburn")]
    assert data[1].tags == ("B-PER", "I-PER") and data[1].guid == "eng.x-7"
    assert data.labels == ("O", "B-ORG", "B-PER", "I-PER")


def test_conll_iob1_conversion_and_iob2_check(tmp_path):
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "O",
        "B-LOC",
        "B-LOC",
        "B-ORG",
    ]
    path = write(tmp_path, "iob1", "Peter I-PER\nBlackburn I-PER\nin O\nParis I-LOC\n")
    with pytest.raises(
        MalformedRowError, match=r"iob1:1: tag I-PER follows O; IOB2 starts every entity with B-PER"
    ):
        read_conll(path)
    (e,) = read_conll(path, scheme="IOB1")
    assert e.tags == ("B-PER", "I-PER", "O", "B-LOC")


def test_conll_malformed_lines_skip_whole_sentence(tmp_path):
    text = "a O\nb B-X\n\nc\nd O\n\ne O O\n\nf B-PER\n\ng B-NOPE\n"
    path = write(tmp_path, "c.txt", text)
    with pytest.raises(MalformedRowError, match=r"c.txt:4: 1 column; expected a token and a tag"):
        read_conll(path)
    data = read_conll(path, skip_bad=True, labels=CONLL2003_LABELS)
    # sentence 1 (B-X not a CoNLL label), 2 (one column), 3 (3 columns), 5 (B-NOPE) are skipped.
    assert [e.tokens for e in data] == [("f",)] and data.skipped == 4
    assert ":2: tag 'B-X' is not one of" in data.problems[0]
    assert ":7: 3 columns; expected 2" in data.problems[2]
    with pytest.raises(MalformedRowError, match=r":1: tag 'x'; expected O, B-<type> or I-<type>"):
        read_conll(write(tmp_path, "d.txt", "a x\n"))


# ---------------------------------------------------------------- multiple choice


def test_swag_csv(tmp_path):
    text = (
        "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
        'v1,0,"A man, smiling. He","A man, smiling.",He,gold,runs.,"sits, then ""waves"".",eats.,sleeps.,1\n'
        "v2,1,x,Ctx,Q,gold,a,b,c,d,7\n"
    )
    path = write(tmp_path, "swag.csv", text)
    with pytest.raises(MalformedRowError, match=r"swag.csv:3: label '7' points to choice 7"):
        read_multiple_choice(path)
    data = read_multiple_choice(path, skip_bad=True)
    (e,) = data
    assert e.context == "A man, smiling." and e.question == "He" and e.label == 1
    assert e.choices == ("runs.", 'sits, then "waves".', "eats.", "sleeps.") and data.skipped == 1


def test_race_json_and_jsonl(tmp_path):
    race = {
        "id": "r1",
        "article": "Text.",
        "questions": ["Q1?", "Q2?"],
        "options": [["a", "b"], ["c", "d", "e"]],
        "answers": ["B", "C"],
    }
    data = read_multiple_choice(write(tmp_path, "r.json", json.dumps(race)))
    assert [(e.guid, e.question, e.label, len(e.choices)) for e in data] == [
        ("r1-0", "Q1?", 1, 2),
        ("r1-1", "Q2?", 2, 3),
    ]
    lines = [
        json.dumps({"context": "C", "question": "Q", "choices": ["x", "y"], "label": 0}),
        "",
        json.dumps({"context": "C", "question": "Q", "choices": ["x"], "label": 0}),
        "{not json",
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(lines))
    with pytest.raises(
        MalformedRowError, match=r"m.jsonl:3: choices \['x'\]; expected a list of at least two"
    ):
        read_multiple_choice(path)
    data = read_multiple_choice(path, skip_bad=True)
    assert len(data) == 1 and data.skipped == 2 and ":4: not valid JSON" in data.problems[1]
    with pytest.raises(ValueError, match="suffix '.txt'"):
        read_multiple_choice(write(tmp_path, "m.txt", ""))


# ---------------------------------------------------------------- generic files


def test_generic_csv_and_jsonl(tmp_path):
    csv_path = write(
        tmp_path, "mine.csv", 'text,text_pair,label\n"Hello, world",Hi,10\nBye,See you,2\nX,Y,10\n'
    )
    data = read_text_pairs(csv_path)
    assert data.labels == ("2", "10")  # numeric sort, not "10" < "2"
    assert [(e.text, e.text_pair, e.label) for e in data] == [
        ("Hello, world", "Hi", 1),
        ("Bye", "See you", 0),
        ("X", "Y", 1),
    ]
    jsonl = write(
        tmp_path,
        "mine.jsonl",
        '{"text": "a", "label": "pos"}\n{"text": "b", "label": "neg"}\n{"text": "c"}\n',
    )
    data = read_text_pairs(jsonl, labels=["neg", "pos"])
    assert [e.label for e in data] == [1, 0, None] and data[0].text_pair is None


def test_generic_errors_and_regression(tmp_path):
    path = write(
        tmp_path,
        "r.jsonl",
        '{"text": "a", "label": 0.5}\n{"text": "", "label": 1}\n{"text": "c", "label": "x"}\n',
    )
    with pytest.raises(MalformedRowError, match=r"r.jsonl:2: text ''; expected a non-empty string"):
        read_text_pairs(path, regression=True)
    data = read_task("text_regression", path, skip_bad=True)
    assert [e.label for e in data] == [0.5] and data.skipped == 2 and "is not a number" in data.problems[1]
    with pytest.raises(MalformedRowError, match=r"t.tsv:3: label 'maybe' is not one of \['no', 'yes'\]"):
        read_text_pairs(write(tmp_path, "t.tsv", "text\tlabel\na\tyes\nb\tmaybe\n"), labels=["no", "yes"])
    with pytest.raises(MalformedRowError, match="has no 'text' column"):
        read_text_pairs(write(tmp_path, "h.csv", "sentence,label\na,1\n"))


# ---------------------------------------------------------------- registry


def test_registry_names_and_kinds():
    assert get_task("SST-2") is TASKS["sst2"] and get_task("STS_B") is TASKS["stsb"]
    assert get_task("MNLI-MM").name == "mnli-mm" and get_task("swag").kind == "multiple_choice"
    assert {s.kind for s in TASKS.values()} == {
        "classification",
        "regression",
        "qa",
        "ner",
        "multiple_choice",
    }
    assert TASKS["cola"].metrics[0] == "mcc" and TASKS["stsb"].metrics == ("pearson", "spearman")
    assert set(TASKS["mrpc"].metrics) == {"f1", "accuracy"} and TASKS["rte"].metrics == ("accuracy",)
    for spec in TASKS.values():
        assert spec.main_metric in spec.metrics
    with pytest.raises(ValueError, match=r"unknown task 'imdb'; expected one of \["):
        get_task("imdb")
