"""Shared set-up of the pretraining tests: a small tokenizer and prepared shards of ../shared/data/text."""

from __future__ import annotations

from pathlib import Path

SHARED_TEXT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "text"


def train_test_tokenizer(corpus: Path, out: Path, vocab_size: int = 1000) -> Path:
    """A byte-fallback-free BPE (``tokenizer.json``) with the DeBERTa special tokens, trained in a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    tok.train(
        [str(corpus)],
        trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False),
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out


def train_spm(corpus: Path, out: Path, vocab_size: int = 1000) -> Path:
    """A SentencePiece vocabulary with DeBERTa's special ids (``debertakit tokenizer train``)."""
    from debertakit.tokenization import train_tokenizer

    train_tokenizer([str(corpus)], vocab_size, "spm", str(out), progress=False)
    return out


def prepared_corpus(tmp: Path, corpus: Path | None = None, valid_fraction: float = 0.02) -> Path:
    """Tokenizer + shards of a corpus (default: WikiText-2 validation) under ``tmp``."""
    from debertakit.data.shards import prepare_corpus

    corpus = corpus or SHARED_TEXT / "wikitext-2-valid.txt"
    tok = train_spm(corpus, tmp / "tokenizer")
    prepare_corpus(
        [str(corpus)], str(tok), str(tmp / "shards"), valid_fraction=valid_fraction, workers=1, progress=False
    )
    return tmp / "shards"
