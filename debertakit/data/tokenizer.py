"""The little that corpus preparation needs from a tokenizer, behind one small interface.

`open_tokenizer(dir)` loads the directory with `debertakit.load_tokenizer` (SentencePiece or byte-level BPE,
as `debertakit tokenizer train` writes them). What the data pipeline keeps (special ids, vocabulary size, the
word-start table, a hash of the files) goes into the shard manifest, so that training does not need the
tokenizer at all.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

# word-start markers of SentencePiece ("▁") and GPT-2 byte-level BPE ("Ġ"); specials start words too
_WORD_MARKERS = ("\u2581", "\u0120")


def directory_hash(path: str | Path) -> str:
    """sha256 over the names and contents of the files of a tokenizer directory."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


class TokenizerHandle:
    """Wraps a loaded tokenizer: batch encoding without special tokens, ids, word starts, identity."""

    def __init__(self, tok: Any, path: str | Path):
        self.tok = tok
        self.path = Path(path)
        self.hash = directory_hash(path)
        self.vocab_size = len(tok)
        self.pad_id = tok.pad_token_id
        self.cls_id = tok.cls_token_id
        self.sep_id = tok.sep_token_id
        self.mask_id = tok.mask_token_id
        self.unk_id = tok.unk_token_id
        for name in ("pad_id", "cls_id", "sep_id", "mask_id"):
            if getattr(self, name) is None:
                raise ValueError(f"tokenizer {path} has no {name.split('_')[0].upper()} token")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return list(self.tok(texts, add_special_tokens=False)["input_ids"])

    def special_ids(self) -> list[int]:
        ids = {self.pad_id, self.cls_id, self.sep_id, self.mask_id, self.unk_id}
        ids |= set(getattr(self.tok, "all_special_ids", []) or [])
        return sorted(int(i) for i in ids if i is not None)

    def word_start_table(self) -> np.ndarray:
        """(V,) bool: True where the token begins a word (or is special)."""
        tokens = self.tok.convert_ids_to_tokens(list(range(self.vocab_size)))
        table = np.array([t is None or t.startswith(_WORD_MARKERS) for t in tokens], dtype=bool)
        table[self.special_ids()] = True
        return table

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "hash": self.hash,
            "vocab_size": int(self.vocab_size),
            "pad_id": int(self.pad_id),
            "cls_id": int(self.cls_id),
            "sep_id": int(self.sep_id),
            "mask_id": int(self.mask_id),
            "unk_id": None if self.unk_id is None else int(self.unk_id),
            "special_ids": self.special_ids(),
        }


class _TokenizersJson:
    """A ``tokenizer.json`` of the tokenizers library with [PAD] [CLS] [SEP] [UNK] [MASK] tokens."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        ids = {
            name: self.backend.token_to_id(f"[{name.upper()}]")
            for name in ("pad", "cls", "sep", "unk", "mask")
        }
        self.pad_token_id, self.cls_token_id, self.sep_token_id = ids["pad"], ids["cls"], ids["sep"]
        self.unk_token_id, self.mask_token_id = ids["unk"], ids["mask"]
        self.all_special_ids = [i for i in ids.values() if i is not None]

    def __len__(self) -> int:
        return self.backend.get_vocab_size()

    def __call__(self, texts: list[str], add_special_tokens: bool = True) -> dict:
        enc = self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in enc]}

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.backend.id_to_token(i) for i in ids]


def open_tokenizer(path: str | Path) -> TokenizerHandle:
    """Load a tokenizer directory: `debertakit.load_tokenizer` (spm.model, or GPT-2 BPE files), or a bare
    ``tokenizer.json`` of the tokenizers library with [PAD] [CLS] [SEP] [UNK] [MASK] tokens."""
    from debertakit.tokenization import load_tokenizer

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {str(path)!r} does not exist")
    if path.is_dir() and (path / "tokenizer.json").exists():
        try:
            return TokenizerHandle(load_tokenizer(path), path)
        except FileNotFoundError:
            return TokenizerHandle(_TokenizersJson(path), path)
    return TokenizerHandle(load_tokenizer(path), path)
