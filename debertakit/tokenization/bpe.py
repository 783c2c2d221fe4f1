"""GPT-2 byte-level BPE vocabularies (DeBERTa v1) as a `tokenizers.Tokenizer`.

DeBERTa v1 uses GPT-2's byte-level BPE (merges and byte-to-unicode mapping) with its own id layout: [PAD]=0
[CLS]=1 [SEP]=2 [UNK]=3, then the BPE tokens, then [MASK]. The released checkpoints order the BPE tokens as the
fairseq dictionary (`dict.txt`, lines "<gpt2 id> <count>") does; from GPT-2's own `encoder.json` without that
dictionary the tokens keep GPT-2's order (id = 4 + GPT-2 id). A `vocab.json` that already holds the special
tokens (a DeBERTa v1 directory, or one written by `save_pretrained`) is used as it is.

Pairs are encoded [CLS] A [SEP] B [SEP] with token types 0 for "[CLS] A [SEP]" and 1 for "B [SEP]", as the
official code and transformers 4.x do and as the released models were trained. transformers 5.x writes
[CLS] A [SEP] [SEP] B [SEP] with all token types 0; single texts are the same in both.
[MASK] takes the space before it ("a [MASK] b" -> "a", [MASK], " b"), as in Hugging Face, so that a masked word
looks like a masked "Ġword" token of pretraining.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from debertakit.tokenization.tokenizer import SPECIAL_TOKENS, DebertaTokenizer

BPE_SPECIAL_IDS = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3}


def read_json_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: expected a JSON object token -> id: {e}") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ValueError(f"{path}: expected a JSON object token -> id")
    return vocab


def read_merges(path: Path) -> list[tuple[str, str]]:
    """Reads a GPT-2 `vocab.bpe` / `merges.txt` (optional "#version" first line, one "a b" pair per line)."""
    merges = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path}:{n}: expected a merge 'a b', got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def deberta_v1_vocab(encoder: dict[str, int], fairseq_dict: list[str] | None = None) -> dict[str, int]:
    """The DeBERTa v1 id layout from a GPT-2 encoder (token -> GPT-2 id).

    Args:
        encoder: GPT-2's `encoder.json`.
        fairseq_dict: optional lines of a fairseq `dict.txt` ("<gpt2 id> <count>"), the order of the released
            checkpoints; tokens absent from it (and entries that are not GPT-2 ids) keep their place after it.

    Returns:
        token -> id with [PAD] [CLS] [SEP] [UNK] first and [MASK] last.
    """
    by_gpt2_id = {i: tok for tok, i in encoder.items()}
    if len(by_gpt2_id) != len(encoder):
        raise ValueError("encoder.json maps two tokens to the same id")
    vocab = dict(BPE_SPECIAL_IDS)
    if fairseq_dict is not None:
        for n, line in enumerate(fairseq_dict, 1):
            key = line.split(" ")[0]
            token = by_gpt2_id.get(int(key)) if key.isdigit() else key
            if token is None:
                raise ValueError(f"dict.txt line {n}: GPT-2 id {key} is not in encoder.json")
            vocab.setdefault(token, len(vocab))
    for gpt2_id in sorted(by_gpt2_id):
        vocab.setdefault(by_gpt2_id[gpt2_id], len(vocab))
    vocab.setdefault(SPECIAL_TOKENS["mask"], len(vocab))
    return vocab


def check_bpe_layout(vocab: dict[str, int], path: Path) -> None:
    got = {t: vocab.get(t) for t in BPE_SPECIAL_IDS}
    if got != BPE_SPECIAL_IDS:
        raise ValueError(f"{path}: expected the DeBERTa v1 special tokens {BPE_SPECIAL_IDS}, got {got}")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{path}: token ids must be 0..{len(vocab) - 1} without gaps")


def bpe_backend(
    vocab: dict[str, int], merges: list[tuple[str, str]], *, add_prefix_space: bool = False
) -> Tokenizer:
    """Byte-level BPE as GPT-2 / DeBERTa v1 encode it (no normalisation, GPT-2 pre-tokenization regex)."""
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, dropout=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False, lstrip=t == SPECIAL_TOKENS["mask"])
            for t in (*BPE_SPECIAL_IDS, SPECIAL_TOKENS["mask"])
        ]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    return backend


def load_bpe_tokenizer(
    vocab_path: str | Path,
    merges_path: str | Path,
    *,
    dict_path: str | Path | None = None,
    model_max_length: int = 512,
) -> DebertaTokenizer:
    """Loads a v1 vocabulary from `vocab.json` + `merges.txt` or GPT-2's `encoder.json` + `vocab.bpe`.

    A vocabulary without the DeBERTa special tokens is treated as a GPT-2 encoder and remapped to the DeBERTa v1
    layout (ordered by `dict_path`, a fairseq dict.txt, when given).
    """
    vocab_path, merges_path = Path(vocab_path), Path(merges_path)
    for p in (vocab_path, merges_path):
        if not p.is_file():
            raise FileNotFoundError(f"BPE vocabulary file not found: {p}")
    vocab = read_json_vocab(vocab_path)
    if not any(t in vocab for t in BPE_SPECIAL_IDS):
        lines = Path(dict_path).read_text(encoding="utf-8").splitlines() if dict_path else None
        vocab = deberta_v1_vocab(vocab, lines)
    check_bpe_layout(vocab, vocab_path)
    mask = vocab.pop(SPECIAL_TOKENS["mask"], None)
    if mask is not None and mask != len(vocab):
        raise ValueError(f"{vocab_path}: [MASK] must have the last id {len(vocab)}, got {mask}")
    merges = read_merges(merges_path)
    backend = bpe_backend(vocab, merges)
    # Pre-split words (token classification) need the "Ġ" of a word that follows a space; Hugging Face asks for
    # add_prefix_space=True in that case, which this second pipeline uses.
    pretokenized = bpe_backend(vocab, merges, add_prefix_space=True)
    return DebertaTokenizer(
        backend,
        kind="bpe",
        model_max_length=model_max_length,
        source_files={"vocab.json": vocab_path, "merges.txt": merges_path},
        pretokenized_backend=pretokenized,
    )
