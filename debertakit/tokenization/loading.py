"""`load_tokenizer(path)`: a tokenizer from a directory or a vocabulary file."""

from __future__ import annotations

import json
from pathlib import Path

from debertakit.tokenization.tokenizer import DebertaTokenizer

_SPM_NAMES = ("spm.model", "spiece.model", "sentencepiece.bpe.model")
_BPE_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))


def _read_config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return config


def load_tokenizer(path: str | Path, *, model_max_length: int | None = None) -> DebertaTokenizer:
    """Loads a DeBERTa tokenizer.

    Args:
        path: a directory holding `spm.model` (v2/v3/mDeBERTa) or `vocab.json` + `merges.txt` (v1; GPT-2's
            `encoder.json` + `vocab.bpe` are remapped to the v1 id layout, ordered by a fairseq `dict.txt` when
            present), with an optional `tokenizer_config.json`; or one of those files itself.
        model_max_length: overrides the value of tokenizer_config.json (default 512).

    Returns:
        The tokenizer.
    """
    from debertakit.tokenization.bpe import load_bpe_tokenizer
    from debertakit.tokenization.spm import load_spm_tokenizer

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path not found: {path}")
    directory = path if path.is_dir() else path.parent
    config = _read_config(directory)
    if config.get("split_by_punct"):
        raise ValueError(f"{directory}: split_by_punct=true is not supported (no released model uses it)")
    max_len = model_max_length or config.get("model_max_length", 512)
    if not isinstance(max_len, int) or max_len > 10**9:  # HF writes a huge sentinel when unset
        max_len = 512

    spm_file = None
    if path.is_file() and path.name not in {name for pair in _BPE_PAIRS for name in pair}:
        spm_file = path
    elif path.is_dir():
        spm_file = next((path / n for n in _SPM_NAMES if (path / n).is_file()), None)
    if spm_file is not None:
        return load_spm_tokenizer(
            spm_file, model_max_length=max_len, do_lower_case=bool(config.get("do_lower_case", False))
        )
    for vocab_name, merges_name in _BPE_PAIRS:
        if path.is_file() and path.name != vocab_name:
            continue
        if (directory / vocab_name).is_file() and (directory / merges_name).is_file():
            dict_path = directory / "dict.txt"
            return load_bpe_tokenizer(
                directory / vocab_name,
                directory / merges_name,
                dict_path=dict_path if dict_path.is_file() else None,
                model_max_length=max_len,
            )
    raise FileNotFoundError(
        f"no tokenizer files in {path}: expected spm.model, or vocab.json + merges.txt, or encoder.json + vocab.bpe"
    )
