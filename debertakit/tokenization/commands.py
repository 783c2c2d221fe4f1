"""`debertakit tokenizer ...` subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import Literal


def train(
    *,
    input: list[str] | str,
    vocab_size: int,
    kind: Literal["spm", "bpe"] = "spm",
    out: Path,
    max_sentences: int = 2_000_000,
) -> None:
    """Trains a DeBERTa vocabulary on text files and writes a tokenizer directory.

    Args:
        input: UTF-8 text files, one sentence or paragraph per line: a file, a list "[a.txt,b.txt]", or
            more files added with --input+ FILE.
        vocab_size: entries before [MASK] ([PAD] [CLS] [SEP] [UNK] included); [MASK] gets id vocab_size.
        kind: spm (SentencePiece unigram, v2/v3/mDeBERTa) or bpe (GPT-2 byte-level BPE, v1).
        out: output directory (spm.model or vocab.json + merges.txt, tokenizer_config.json,
            special_tokens_map.json).
        max_sentences: spm only: at most this many lines are sampled for training.
    """
    from debertakit.tokenization.training import train_tokenizer

    files = [input] if isinstance(input, str) else list(input)
    tok = train_tokenizer(files, vocab_size, kind, out, max_sentences=max_sentences)
    print(f"wrote {tok.kind} tokenizer with {tok.vocab_size} ids ([MASK] = {tok.mask_token_id}) to {out}")


def tokenizer_commands() -> dict:
    """The `tokenizer` subcommand group."""
    return {"train": train}
