"""Shared fixtures: a SentencePiece model trained here, the GPT-2 BPE files, real text, Hugging Face oracles."""

from __future__ import annotations

import csv
import json
import unicodedata
import warnings
from pathlib import Path

import pytest

DATA = (Path(__file__).resolve().parents[2] / "../shared/data").resolve()

# Edge cases for every parity test: normalisation, accents, CJK, emoji, numbers, long words, whitespace.
EDGE_CASES = [
    "",
    " ",
    "   \t \n ",
    "ﬁnance ﬂow",
    "café naïve résumé Ångström",
    "e\u0301 combining acute",
    "ＡＢＣ full-width １２３",
    "日本語のテキストと中文文本",
    "한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧",
    "numbers 3.14159 1,000,000 2024-01-31 0x1F",
    "pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "repeated     spaces   here",
    "tabs\tand\tnewlines\nand\r\nreturns",
    "  leading and trailing  ",
    "\u00a0non-breaking\u00a0space\u3000ideographic",
    "control\x00chars\x07\x1b[0m",
    "zero\u200bwidth\u200cjoiners\u200d",
    "Ĳ ǆ ℌ ① ™ ½ ²",
    "RTL עברית العربية",
    "mixed CASE Words AND punctuation!?;:…",
    "quotes “double” ‘single’ «guillemets»",
    "<unk> @-@ @,@ tokens",
    "a" * 500,
]


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not found: {path} (expected ../shared/data next to the repository)")
    return path


def read_lines(name: str, limit: int | None = None) -> list[str]:
    lines = [ln for ln in _require(DATA / name).read_text(encoding="utf-8").splitlines() if ln.strip()]
    return lines[:limit]


def glue_sentences() -> list[str]:
    rows = csv.reader(_require(DATA / "glue/SST-2/dev.tsv").open(encoding="utf-8"), delimiter="\t", quoting=3)
    sst = [r[0] for i, r in enumerate(rows) if i > 0]
    cola = [
        r[3]
        for r in csv.reader((DATA / "glue/CoLA/dev.tsv").open(encoding="utf-8"), delimiter="\t", quoting=3)
    ]
    return sst + cola


def glue_pairs(limit: int = 1000) -> list[tuple[str, str]]:
    with _require(DATA / "glue/MRPC/msr_paraphrase_test.txt").open(encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=3))[1:]
    with (DATA / "glue/RTE/dev.tsv").open(encoding="utf-8") as f:
        rte = list(csv.reader(f, delimiter="\t", quoting=3))[1:]
    return ([(r[3], r[4]) for r in rows] + [(r[0], r[1]) for r in rte])[:limit]


def squad_examples(limit: int = 1500) -> list[tuple[str, str]]:
    data = json.loads(_require(DATA / "squad/dev-v1.1-part1.json").read_text(encoding="utf-8"))["data"]
    out = [(qa["question"], p["context"]) for art in data for p in art["paragraphs"] for qa in p["qas"]]
    return out[:limit]


def nfkc_stable(*texts: str) -> bool:
    """True when NFKC leaves the texts unchanged (there transformers 5.x normalises as sentencepiece does)."""
    return all(unicodedata.normalize("NFKC", t) == t for t in texts)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return _require(DATA)


@pytest.fixture(scope="session")
def real_lines() -> list[str]:
    """Several thousand real lines: WikiText-2, GLUE sentences, SQuAD questions and contexts."""
    squad = squad_examples(600)
    lines = read_lines("text/wikitext-2-valid.txt") + glue_sentences()
    lines += [q for q, _ in squad] + sorted({c for _, c in squad})
    return lines


@pytest.fixture(scope="session")
def spm_dir(tmp_path_factory) -> Path:
    from debertakit.tokenization import train_tokenizer

    out = tmp_path_factory.mktemp("spm")
    train_tokenizer([_require(DATA / "text/wikitext-2-valid.txt")], 2000, "spm", out, progress=False)
    return out


@pytest.fixture(scope="session")
def spm_tok(spm_dir):
    from debertakit.tokenization import load_tokenizer

    return load_tokenizer(spm_dir)


@pytest.fixture(scope="session")
def sp(spm_dir):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(spm_dir / "spm.model"))


@pytest.fixture(scope="session")
def hf_spm(spm_dir):
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.DebertaV2TokenizerFast.from_pretrained(str(spm_dir))


@pytest.fixture(scope="session")
def bpe_tok():
    from debertakit.tokenization import load_tokenizer

    return load_tokenizer(_require(DATA / "bpe-gpt2"))


@pytest.fixture(scope="session")
def bpe_dir(bpe_tok, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bpe")
    bpe_tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hf_bpe(bpe_dir):
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.DebertaTokenizerFast.from_pretrained(str(bpe_dir))
