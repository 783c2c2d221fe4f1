"""The tokenizer object shared by the SentencePiece (v2/v3/mDeBERTa) and GPT-2 BPE (v1) vocabularies.

A `DebertaTokenizer` wraps a `tokenizers.Tokenizer` (the Rust library Hugging Face's fast tokenizers use) that is
configured to reproduce the released DeBERTa tokenization (see `spm.py` and `bpe.py`). Truncation, overflowing
windows, padding, offsets and word ids come from that library, so they follow the same rules as Hugging Face's
fast tokenizers. Calling the object looks like calling a Hugging Face tokenizer.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from tokenizers import Encoding, Tokenizer

SPECIAL_TOKENS = {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"}
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
PADDING_STRATEGIES = ("longest", "max_length", "do_not_pad")

# Lone UTF-16 surrogates cannot be encoded as UTF-8, so neither the Rust library nor sentencepiece accepts them.
# Each one is replaced by U+FFFD (one character for one character, so offsets into the caller's string stay valid).
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Replaces lone surrogates by U+FFFD; every other character is kept."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


class BatchEncoding(dict):
    """The result of calling a tokenizer: a dict of lists (or tensors) plus the per-sequence `Encoding`s."""

    def __init__(self, data: dict[str, Any], encodings: list[Encoding], batched: bool):
        super().__init__(data)
        self.encodings = encodings
        self._batched = batched

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(name) from e

    def _encoding(self, batch_index: int) -> Encoding:
        if not 0 <= batch_index < len(self.encodings):
            raise ValueError(f"batch_index {batch_index} out of range for {len(self.encodings)} sequences")
        return self.encodings[batch_index]

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Index of the word each token comes from (None for special and padding tokens), for token labels."""
        return self._encoding(batch_index).word_ids

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        """0 for tokens of the first text, 1 for the second, None for special and padding tokens."""
        return self._encoding(batch_index).sequence_ids

    def tokens(self, batch_index: int = 0) -> list[str]:
        """The token strings of one sequence."""
        return self._encoding(batch_index).tokens


class DebertaTokenizer:
    """A DeBERTa tokenizer: `tok(text, text_pair=None, ...)` -> dict with `input_ids`, `token_type_ids`, ...

    Args:
        backend: the configured `tokenizers.Tokenizer` (special tokens registered, post-processor set).
        kind: "spm" (SentencePiece, v2/v3/mDeBERTa) or "bpe" (GPT-2 byte-level BPE, v1).
        model_max_length: the default `max_length` when truncation is on without one.
        source_files: the files the vocabulary was read from, or the bytes of one trained in memory (written by
            `save_pretrained`).
        options: extra settings written to tokenizer_config.json (e.g. do_lower_case).
    """

    def __init__(
        self,
        backend: Tokenizer,
        *,
        kind: Literal["spm", "bpe"],
        model_max_length: int = 512,
        source_files: dict[str, Path | bytes] | None = None,
        options: dict[str, Any] | None = None,
        pretokenized_backend: Tokenizer | None = None,
    ):
        if kind not in ("spm", "bpe"):
            raise ValueError(f"kind must be 'spm' or 'bpe', got {kind!r}")
        self._backend = backend
        self._pretokenized_backend = pretokenized_backend or backend
        self.kind = kind
        self.model_max_length = int(model_max_length)
        self.source_files = dict(source_files or {})
        self.options = dict(options or {})
        self.padding_side = "right"
        self.truncation_side = "right"
        for name, token in SPECIAL_TOKENS.items():
            token_id = backend.token_to_id(token)
            if token_id is None:
                raise ValueError(f"special token {token} is missing from the vocabulary")
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", token_id)
        self.num_special_tokens_single = backend.num_special_tokens_to_add(False)
        self.num_special_tokens_pair = backend.num_special_tokens_to_add(True)

    # ----------------------------------------------------------------------------------------- properties
    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids, [MASK] included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def all_special_ids(self) -> list[int]:
        return [getattr(self, f"{name}_token_id") for name in SPECIAL_TOKENS]

    def get_vocab(self) -> dict[str, int]:
        """token -> id, [MASK] included."""
        return self._backend.get_vocab(with_added_tokens=True)

    def __repr__(self) -> str:
        return f"DebertaTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, model_max_length={self.model_max_length})"

    # ------------------------------------------------------------------------------------------- encoding
    def __call__(
        self,
        text: str | Sequence[str] | Sequence[Sequence[str]],
        text_pair: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        stride: int = 0,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool = True,
        return_attention_mask: bool = True,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
    ) -> BatchEncoding:
        """Encodes one text (or pair) or a batch of them.

        Args:
            text: a string, or a list of strings (a batch); with `is_split_into_words`, a list of words or a
                list of such lists.
            text_pair: the second texts (same shape as `text`), giving [CLS] A [SEP] B [SEP].
            add_special_tokens: add [CLS]/[SEP].
            padding: False / "do_not_pad", True / "longest" (longest in the batch), or "max_length".
            truncation: False/None, True / "longest_first", "only_first" or "only_second".
            max_length: the length limit (special tokens included); defaults to `model_max_length` when
                truncation or max_length padding is on.
            stride: with `return_overflowing_tokens`, how many tokens consecutive windows share.
            is_split_into_words: the input is already split into words (for token classification).
            pad_to_multiple_of: round padded lengths up to a multiple of this.
            return_tensors: None (lists) or "pt" (torch tensors).
            return_token_type_ids: include `token_type_ids`.
            return_attention_mask: include `attention_mask`.
            return_overflowing_tokens: return every window of a truncated text as its own row, plus
                `overflow_to_sample_mapping` (row -> input index).
            return_special_tokens_mask: include `special_tokens_mask` (1 for special tokens).
            return_offsets_mapping: include `offset_mapping`: (start, end) character offsets into the input
                text for every token, (0, 0) for special and padding tokens.
            return_length: include `length` (tokens per row, padding included).

        Returns:
            A `BatchEncoding` (a dict). Without a batch dimension for a single input, unless overflowing
            windows or tensors are requested.
        """
        batched, texts, pairs = self._split_inputs(text, text_pair, is_split_into_words)
        strategy, max_length = self._truncation_args(truncation, max_length, padding)
        pad_strategy = self._padding_strategy(padding)
        if stride < 0:
            raise ValueError(f"stride must be >= 0, got {stride}")
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
        backend = self._pretokenized_backend if is_split_into_words else self._backend
        if strategy is not None:
            n_special = (
                self.num_special_tokens_pair if pairs else self.num_special_tokens_single
            ) * add_special_tokens
            if max_length <= n_special:
                raise ValueError(
                    f"max_length {max_length} leaves no room for text after the {n_special} special tokens"
                )
            if return_overflowing_tokens and stride >= max_length - n_special:
                raise ValueError(
                    f"stride {stride} must be smaller than max_length {max_length} minus the {n_special} special "
                    f"tokens ({max_length - n_special})"
                )
        encodings = self._encode(
            backend, texts, pairs, strategy, max_length, stride, is_split_into_words, add_special_tokens
        )
        rows, sample_map = [], []
        for i, enc in enumerate(encodings):
            for window in [enc, *enc.overflowing] if return_overflowing_tokens else [enc]:
                rows.append(window)
                sample_map.append(i)
        self._pad(rows, pad_strategy, max_length, pad_to_multiple_of)

        data: dict[str, Any] = {"input_ids": [e.ids for e in rows]}
        if return_token_type_ids:
            data["token_type_ids"] = [e.type_ids for e in rows]
        if return_attention_mask:
            data["attention_mask"] = [e.attention_mask for e in rows]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [e.special_tokens_mask for e in rows]
        if return_offsets_mapping:
            data["offset_mapping"] = [e.offsets for e in rows]
        if return_length:
            data["length"] = [len(e.ids) for e in rows]
        if return_overflowing_tokens:
            data["overflow_to_sample_mapping"] = sample_map
        if return_tensors == "pt":
            data = self._to_tensors(data)
        elif not batched and not return_overflowing_tokens:
            data = {k: v[0] for k, v in data.items()}
        return BatchEncoding(data, rows, batched or return_overflowing_tokens)

    def _split_inputs(
        self, text: Any, text_pair: Any, is_split_into_words: bool
    ) -> tuple[bool, list, list | None]:
        def is_words(x: Any) -> bool:
            return isinstance(x, (list, tuple)) and all(isinstance(w, str) for w in x)

        def check(x: Any, what: str) -> tuple[bool, list]:
            if is_split_into_words:
                if is_words(x):
                    return False, [[clean_text(w) for w in x]]
                if isinstance(x, (list, tuple)) and all(is_words(s) for s in x):
                    return True, [[clean_text(w) for w in s] for s in x]
                raise ValueError(
                    f"{what} must be a list of words or a list of such lists with is_split_into_words=True, "
                    f"got {_describe(x)}"
                )
            if isinstance(x, str):
                return False, [clean_text(x)]
            if isinstance(x, (list, tuple)) and all(isinstance(s, str) for s in x):
                return True, [clean_text(s) for s in x]
            raise ValueError(f"{what} must be a str or a list of str, got {_describe(x)}")

        batched, texts = check(text, "text")
        if text_pair is None:
            return batched, texts, None
        pair_batched, pairs = check(text_pair, "text_pair")
        if pair_batched != batched or len(pairs) != len(texts):
            raise ValueError(
                f"text_pair must match text: got {len(texts)} text(s) {'in a batch' if batched else ''} and "
                f"{len(pairs)} text_pair(s) {'in a batch' if pair_batched else ''}"
            )
        return batched, texts, pairs

    def _truncation_args(
        self, truncation: Any, max_length: int | None, padding: Any
    ) -> tuple[str | None, int | None]:
        if truncation is True:
            strategy = "longest_first"
        elif truncation in (False, None, "do_not_truncate"):
            strategy = None
            if truncation is None and max_length is not None and padding in (False, None, "do_not_pad"):
                # As Hugging Face does: a max_length without an explicit truncation choice truncates.
                warnings.warn(
                    "max_length is given without truncation; truncating with 'longest_first'", stacklevel=3
                )
                strategy = "longest_first"
        elif truncation in TRUNCATION_STRATEGIES:
            strategy = truncation
        else:
            raise ValueError(
                f"truncation must be a bool or one of {', '.join(TRUNCATION_STRATEGIES)}, got {truncation!r}"
            )
        if max_length is None and (strategy is not None or padding == "max_length"):
            max_length = self.model_max_length
        if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        return strategy, max_length

    @staticmethod
    def _padding_strategy(padding: Any) -> str | None:
        if padding is True or padding == "longest":
            return "longest"
        if padding in (False, None, "do_not_pad"):
            return None
        if padding == "max_length":
            return "max_length"
        raise ValueError(f"padding must be a bool or one of {', '.join(PADDING_STRATEGIES)}, got {padding!r}")

    def _encode(
        self,
        backend: Tokenizer,
        texts: list,
        pairs: list | None,
        strategy: str | None,
        max_length: int | None,
        stride: int,
        is_pretokenized: bool,
        add_special_tokens: bool,
    ) -> list[Encoding]:
        if strategy is None:
            backend.no_truncation()
        else:
            backend.enable_truncation(
                max_length, stride=stride, strategy=strategy, direction=self.truncation_side
            )
        backend.no_padding()
        inputs = texts if pairs is None else list(zip(texts, pairs))
        try:
            return backend.encode_batch(
                inputs, is_pretokenized=is_pretokenized, add_special_tokens=add_special_tokens
            )
        except Exception as e:  # the Rust library raises a bare Exception for truncation problems
            if "Truncation error" in str(e):
                raise ValueError(
                    f"cannot truncate with strategy {strategy!r} to max_length {max_length}: {e} "
                    "(the sequence that may be truncated is shorter than the overflow; use 'longest_first' or a "
                    "larger max_length)"
                ) from None
            raise
        except BaseException as e:  # a Rust panic arrives as pyo3's PanicException (a BaseException)
            if type(e).__name__ == "PanicException" and "stride" in str(e):
                # With a pair, the room of the truncated text can be smaller than the stride; windows that share
                # `stride` tokens cannot advance then.
                raise ValueError(
                    f"stride {stride} is too large for max_length {max_length} with strategy {strategy!r}: the "
                    f"part of the window left to the truncated text must be longer than the stride ({e})"
                ) from None
            raise
        finally:
            backend.no_truncation()

    def _pad(
        self, rows: list[Encoding], strategy: str | None, max_length: int | None, multiple: int | None
    ) -> None:
        if strategy is None or not rows:
            return
        if strategy == "longest":
            target = max(len(e.ids) for e in rows)
        else:
            target = max_length
        if multiple:
            target = -(-target // multiple) * multiple
        for e in rows:
            if len(e.ids) < target:
                e.pad(
                    target,
                    direction=self.padding_side,
                    pad_id=self.pad_token_id,
                    pad_type_id=0,
                    pad_token=self.pad_token,
                )

    @staticmethod
    def _to_tensors(data: dict[str, Any]) -> dict[str, Any]:
        import torch

        out = {}
        for key, value in data.items():
            lengths = {len(row) for row in value} if value and isinstance(value[0], list) else set()
            if len(lengths) > 1:
                raise ValueError(
                    f"return_tensors='pt' needs rows of equal length, got {key} lengths {sorted(lengths)}; "
                    "pass padding=True (or padding='max_length')"
                )
            out[key] = torch.tensor(value, dtype=torch.long)
        return out

    def encode(self, text: str, text_pair: str | None = None, **kwargs: Any) -> list[int]:
        """Token ids of one text (or pair), special tokens included unless `add_special_tokens=False`."""
        if not isinstance(text, str):
            raise ValueError(f"encode takes one str, got {_describe(text)}; call the tokenizer for batches")
        return self(text, text_pair, **kwargs)["input_ids"]

    def tokenize(self, text: str) -> list[str]:
        """The token strings of `text`, without special tokens."""
        return self(text, add_special_tokens=False).tokens()

    # ------------------------------------------------------------------------------------------- decoding
    def _check_ids(self, ids: Any) -> list[int]:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        out = []
        for pos, i in enumerate(ids):
            if not isinstance(i, int) or isinstance(i, bool):
                raise ValueError(f"token ids must be ints, got {i!r} at position {pos}")
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"token id {i} at position {pos} is outside [0, vocab_size {self.vocab_size})"
                )
            out.append(i)
        return out

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of a sequence of ids (a list, a 1-D tensor or array).

        No "clean-up" of spaces before punctuation is applied, so for text the vocabulary covers
        `decode(encode(x), skip_special_tokens=True)` gives back `x` (BPE) or its normalised form (SentencePiece).
        """
        return self._backend.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch: Iterable[Any], skip_special_tokens: bool = False) -> list[str]:
        """`decode` for each row of a batch (a list of lists or a 2-D tensor)."""
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in batch]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        """Token string(s) of id(s)."""
        single = isinstance(ids, int)
        tokens = [self._backend.id_to_token(i) for i in self._check_ids(ids)]
        return tokens[0] if single else tokens

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Id(s) of token string(s); unknown tokens give `unk_token_id`."""
        if isinstance(tokens, str):
            found = self._backend.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    # --------------------------------------------------------------------------------------------- saving
    def save_pretrained(self, directory: str | Path) -> list[Path]:
        """Writes the files that `load_tokenizer` and Hugging Face's `AutoTokenizer.from_pretrained` read."""
        from debertakit.tokenization.saving import save_tokenizer

        return save_tokenizer(self, Path(directory))


def _describe(x: Any) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text[:80] + '...' if len(text) > 80 else text}"
