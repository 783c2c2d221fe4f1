"""Training a new vocabulary (for pretraining from scratch) with sentencepiece or the tokenizers library."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from tqdm.auto import tqdm

from debertakit.tokenization.tokenizer import SPECIAL_TOKENS, DebertaTokenizer

_MIN_VOCAB = {"spm": 8, "bpe": 4 + 256}


def _lines(files: Sequence[Path], progress: bool) -> Iterator[str]:
    total = sum(f.stat().st_size for f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="reading corpus", disable=not progress) as bar:
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    bar.update(len(line.encode("utf-8", errors="replace")))
                    line = line.rstrip("\n")
                    if line.strip():
                        yield line


def train_tokenizer(
    files: Sequence[str | Path],
    vocab_size: int,
    kind: Literal["spm", "bpe"] = "spm",
    out: str | Path | None = None,
    *,
    max_sentences: int = 2_000_000,
    character_coverage: float = 0.9995,
    model_max_length: int = 512,
    seed: int = 0,
    progress: bool = True,
) -> DebertaTokenizer:
    """Trains a DeBERTa vocabulary on text files (one sentence or paragraph per line).

    Args:
        files: UTF-8 text files.
        vocab_size: number of entries before [MASK] (pieces for spm, tokens for bpe), the four special tokens
            [PAD] [CLS] [SEP] [UNK] included; [MASK] is appended as id `vocab_size`.
        kind: "spm" (SentencePiece unigram, as v2/v3/mDeBERTa) or "bpe" (GPT-2 byte-level BPE, as v1).
        out: directory to write (spm.model or vocab.json + merges.txt, with the config files); None keeps the
            result in memory only for bpe and writes spm files to a temporary directory.
        max_sentences: at most this many lines are sampled for spm training.
        character_coverage: spm only: the share of characters the pieces must cover (the rest become [UNK]).
        model_max_length: the default truncation length written to tokenizer_config.json.
        seed: spm sampling seed.
        progress: show a progress bar while reading the corpus.

    Returns:
        The trained tokenizer (already saved in `out` when given).
    """
    if kind not in ("spm", "bpe"):
        raise ValueError(f"kind must be 'spm' or 'bpe', got {kind!r}")
    if isinstance(files, (str, Path)):
        files = [files]
    paths = [Path(f) for f in files]
    if not paths:
        raise ValueError("no input files given")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"training input not found: {p}")
    if not isinstance(vocab_size, int) or vocab_size < _MIN_VOCAB[kind]:
        raise ValueError(
            f"vocab_size must be an int >= {_MIN_VOCAB[kind]} for kind {kind!r}, got {vocab_size!r}"
        )
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
    trainer = _train_spm if kind == "spm" else _train_bpe
    tok = trainer(
        paths,
        vocab_size,
        progress=progress,
        max_sentences=max_sentences,
        character_coverage=character_coverage,
        seed=seed,
        model_max_length=model_max_length,
    )
    if out is not None:
        tok.save_pretrained(out)
    return tok


def _train_spm(
    paths, vocab_size, *, progress, max_sentences, character_coverage, seed, model_max_length, **_
):
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)

    from debertakit.tokenization.spm import spm_tokenizer_from_bytes

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_lines(paths, progress),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=character_coverage,
            pad_id=0,
            pad_piece=SPECIAL_TOKENS["pad"],
            bos_id=1,
            bos_piece=SPECIAL_TOKENS["cls"],
            eos_id=2,
            eos_piece=SPECIAL_TOKENS["sep"],
            unk_id=3,
            unk_piece=SPECIAL_TOKENS["unk"],
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            minloglevel=2,
        )
    except RuntimeError as e:
        # e.g. "Vocabulary size is too high (N). Please set it to a value <= M."
        raise ValueError(f"SentencePiece training failed for vocab_size {vocab_size}: {e}") from None
    # Held in memory: `train_tokenizer` writes it (save_pretrained) only when given a directory.
    return spm_tokenizer_from_bytes(model.getvalue(), model_max_length=model_max_length)


def _train_bpe(paths, vocab_size, *, progress, model_max_length, **_):
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE

    from debertakit.tokenization.bpe import BPE_SPECIAL_IDS, bpe_backend
    from debertakit.tokenization.tokenizer import DebertaTokenizer

    raw = Tokenizer(BPE(unk_token=None, fuse_unk=False))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(BPE_SPECIAL_IDS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_lines(paths, progress), trainer=trainer)
    vocab = raw.get_vocab(with_added_tokens=True)
    merges = _model_merges(raw)
    backend = bpe_backend(vocab, merges)
    pretokenized = bpe_backend(vocab, merges, add_prefix_space=True)
    return DebertaTokenizer(
        backend, kind="bpe", model_max_length=model_max_length, pretokenized_backend=pretokenized
    )


def _model_merges(backend) -> list[tuple[str, str]]:
    import json

    merges = json.loads(backend.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
