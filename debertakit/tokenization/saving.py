"""Writing a tokenizer directory that both `load_tokenizer` and Hugging Face's `AutoTokenizer` read.

SentencePiece: `spm.model` + `tokenizer_config.json` + `special_tokens_map.json`, the layout of the released
v2/v3 checkpoints. BPE (v1): `vocab.json` (DeBERTa v1 ids, [MASK] included) + `merges.txt` + the same two JSON
files.
"""

from __future__ import annotations

import json
from pathlib import Path

from debertakit.tokenization.tokenizer import SPECIAL_TOKENS, DebertaTokenizer

HF_CLASS = {"spm": "DebertaV2Tokenizer", "bpe": "DebertaTokenizer"}


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")  # written whole, then renamed: never a half-written file
    tmp.write_bytes(data)
    tmp.replace(path)


def _write_json(path: Path, data: dict) -> None:
    _write_bytes(path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


# v1's [MASK] takes the space before it (see bpe.py); Hugging Face reads that from the token's "lstrip".
_MASK_LSTRIP = {
    "content": SPECIAL_TOKENS["mask"],
    "lstrip": True,
    "rstrip": False,
    "normalized": False,
    "single_word": False,
    "special": True,
}


def tokenizer_config(tok: DebertaTokenizer) -> dict:
    special = {f"{name}_token": token for name, token in SPECIAL_TOKENS.items()}
    if tok.kind == "bpe":
        special["mask_token"] = _MASK_LSTRIP
    config = {
        "tokenizer_class": HF_CLASS[tok.kind],
        "vocab_type": tok.kind,
        "model_max_length": tok.model_max_length,
        "bos_token": SPECIAL_TOKENS["cls"],
        "eos_token": SPECIAL_TOKENS["sep"],
        **special,
    }
    if tok.kind == "spm":
        config.update(do_lower_case=bool(tok.options.get("do_lower_case", False)), split_by_punct=False)
    else:
        config.update(add_prefix_space=False, errors="replace")
    return config


def save_tokenizer(tok: DebertaTokenizer, directory: Path) -> list[Path]:
    """Writes `tok` into `directory` (created if needed) and returns the written files."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if tok.kind == "spm":
        target = directory / "spm.model"
        source = tok.source_files["spm.model"]
        if isinstance(source, bytes):  # trained in memory
            _write_bytes(target, source)
        elif source.resolve() != target.resolve():
            _write_bytes(target, source.read_bytes())
        written.append(target)
    else:
        tok.backend.model.save(str(directory))  # vocab.json (without [MASK]) and merges.txt
        vocab = tok.get_vocab()
        _write_json(directory / "vocab.json", dict(sorted(vocab.items(), key=lambda kv: kv[1])))
        written += [directory / "vocab.json", directory / "merges.txt"]
    special_map = {f"{name}_token": token for name, token in SPECIAL_TOKENS.items()}
    special_map.update(bos_token=SPECIAL_TOKENS["cls"], eos_token=SPECIAL_TOKENS["sep"])
    if tok.kind == "bpe":
        special_map["mask_token"] = _MASK_LSTRIP
    _write_json(directory / "special_tokens_map.json", special_map)
    _write_json(directory / "tokenizer_config.json", tokenizer_config(tok))
    written += [directory / "special_tokens_map.json", directory / "tokenizer_config.json"]
    return written
