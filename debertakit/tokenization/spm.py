"""SentencePiece vocabularies (DeBERTa v2, v3, mDeBERTa) as a `tokenizers.Tokenizer`.

The released models were trained with the `sentencepiece` library itself (the official repository's
`SPMTokenizer` calls `SentencePieceProcessor.encode`), so the target is sentencepiece's output on the same
`spm.model`: its own normalisation rules (for the released files `nmt_nfkc`, which maps e.g. "ﬁ" to "fi"), a
dummy "▁" prefix, runs of spaces collapsed and leading/trailing spaces removed. The pipeline below reproduces it
with the precompiled character map stored in the model file; ids are then checked against sentencepiece in the
tests.

Hugging Face transformers 5.x builds `DebertaV2Tokenizer` with a different normaliser (NFC, whitespace regex)
instead of the model's character map, so it differs from sentencepiece on text that NFKC changes ("ﬁ",
full-width forms, some spaces). transformers 4.x used the character map, as here.

One known gap of the `tokenizers` library's precompiled normaliser: when a character that the map expands
(e.g. "ﬁ", "Ĳ") is followed by a combining mark in the same grapheme, the mark is dropped, while sentencepiece
keeps it ("ﬁ\u0301" -> "fi" instead of "fí"). Text without such sequences is tokenized exactly as sentencepiece does,
up to exact ties: when two segmentations have the same total score (runs of one character such as "lll" =
"l"+"ll" = "ll"+"l"), sentencepiece's choice follows the float32 rounding of its Viterbi sums and the
`tokenizers` library's its float64 sums, so they may pick different (equally scored) segmentations. Hugging
Face's fast tokenizer has the same gap; the tests check that every difference is such a tie.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram

from debertakit.tokenization.tokenizer import SPECIAL_TOKENS, DebertaTokenizer

# The id layout of the released v2/v3/mDeBERTa vocabularies: pieces 0..3 are these (sentencepiece control and
# unknown symbols), [MASK] is appended after the last piece (128000 for v3, 250101 for mDeBERTa).
SPM_SPECIAL_IDS = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3}
_UNIGRAM, _NORMAL, _UNKNOWN, _CONTROL = 1, 1, 2, 3


def read_spm_proto(path: Path):
    """Parses an spm.model file (a sentencepiece ModelProto)."""
    return parse_spm_proto(Path(path).read_bytes(), path)


def parse_spm_proto(data: bytes, source: str | Path):
    """Parses the bytes of an spm.model; `source` names them in errors."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError
        raise ValueError(f"{source} is not a SentencePiece model file: {e}") from None
    if not proto.pieces:
        raise ValueError(f"{source} is not a SentencePiece model file (no pieces)")
    return proto


def check_spm_layout(proto, path: Path) -> None:
    """Raises ValueError unless the model is a unigram model with [PAD] [CLS] [SEP] [UNK] at ids 0..3."""
    if proto.trainer_spec.model_type != _UNIGRAM:
        raise ValueError(
            f"{path}: DeBERTa vocabularies are unigram SentencePiece models, got model_type "
            f"{proto.trainer_spec.model_type} (1 = unigram)"
        )
    got = {p.piece: i for i, p in enumerate(proto.pieces[:4])}
    if got != SPM_SPECIAL_IDS:
        raise ValueError(
            f"{path}: expected the DeBERTa special pieces {SPM_SPECIAL_IDS} at ids 0..3, got {got} "
            "(train with `debertakit tokenizer train --kind spm`)"
        )
    if any(p.piece == SPECIAL_TOKENS["mask"] for p in proto.pieces):
        raise ValueError(f"{path}: [MASK] must not be a piece; it is appended after the pieces")


def spm_backend(proto, *, do_lower_case: bool = False) -> Tokenizer:
    """Builds the `tokenizers.Tokenizer` that encodes like `sentencepiece` on the same model."""
    spec = proto.normalizer_spec
    vocab = [(p.piece, p.score) for p in proto.pieces]
    backend = Tokenizer(
        Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=proto.trainer_spec.byte_fallback)
    )

    steps = [normalizers.Lowercase()] if do_lower_case else []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        # sentencepiece collapses runs of spaces and removes leading/trailing ones *after* the character map
        # (which turns tabs, newlines and other spaces into " "). Only " " counts, as in sentencepiece.
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("^ | $"), "")]
    backend.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spec.add_dummy_prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend)
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend)

    # [MASK] gets the next id; the control pieces become "special" so that [CLS]/[SEP]/[PAD]/[UNK] written in a
    # text are recognised (as in Hugging Face) and skipped by decode(skip_special_tokens=True).
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (*SPM_SPECIAL_IDS, SPECIAL_TOKENS["mask"])]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    return backend


def load_spm_tokenizer(
    path: str | Path, *, model_max_length: int = 512, do_lower_case: bool = False
) -> DebertaTokenizer:
    """Loads a DeBERTa SentencePiece vocabulary (`spm.model`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
    return _spm_tokenizer(read_spm_proto(path), path, path, model_max_length, do_lower_case)


def spm_tokenizer_from_bytes(
    data: bytes, *, model_max_length: int = 512, do_lower_case: bool = False
) -> DebertaTokenizer:
    """A vocabulary held in memory (a freshly trained one): `save_pretrained` writes these bytes as spm.model."""
    proto = parse_spm_proto(data, "the given bytes")
    return _spm_tokenizer(proto, "the given bytes", bytes(data), model_max_length, do_lower_case)


def _spm_tokenizer(proto, name, source: Path | bytes, model_max_length, do_lower_case) -> DebertaTokenizer:
    check_spm_layout(proto, name)
    backend = spm_backend(proto, do_lower_case=do_lower_case)
    return DebertaTokenizer(
        backend,
        kind="spm",
        model_max_length=model_max_length,
        source_files={"spm.model": source},
        options={"do_lower_case": do_lower_case},
    )
