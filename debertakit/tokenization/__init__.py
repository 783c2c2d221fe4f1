"""Tokenizers for the DeBERTa family: SentencePiece (v2, v3, mDeBERTa) and GPT-2 byte-level BPE (v1)."""

from debertakit.tokenization.loading import load_tokenizer
from debertakit.tokenization.tokenizer import BatchEncoding, DebertaTokenizer
from debertakit.tokenization.training import train_tokenizer

__all__ = ["BatchEncoding", "DebertaTokenizer", "load_tokenizer", "train_tokenizer"]
