"""Packing documents into full-length rows, and the batches the training loop reads.

A row holds ``seq_len`` tokens: documents one after another, each segment written ``[CLS] tokens [SEP]``.
A document that does not fit in the rest of a row continues in the next one (a new segment); a document longer
than a row is cut. Only when fewer than 3 places are left (no room for ``[CLS] x [SEP]``) is a row padded, so
rows are full and there is almost no padding.

Two ways to feed a batch of rows to the model (`RowBatcher`):

* ``padding_free=False``: (B, seq_len) with an attention mask; segments of a row see each other (as the
  official pretraining, which cuts a continuous text stream into rows).
* ``padding_free=True``: all rows concatenated into one (1, T) row with ``cu_seqlens`` at every segment
  boundary: no padding at all, relative positions restart in each segment and no token attends across
  documents (DESIGN.md principle 4).

Batches are a pure function of (seed, global sample index): the order of rows is a seeded permutation per
epoch and every row's mask is drawn from a generator seeded by (seed, epoch, row). Resuming needs only the
step, and a process of a multi-process run reads only its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from debertakit.data.masking import IGNORE_INDEX, MaskingConfig, Vocabulary, mask_row
from debertakit.data.shards import ShardSet


@dataclass
class RowPlan:
    """Segments of every row, in CSR form: the segments of row r are ``row_ptr[r]:row_ptr[r + 1]``."""

    row_ptr: np.ndarray  # (R + 1,) int64
    shard: np.ndarray  # (S,) int32 shard of each segment
    start: np.ndarray  # (S,) int64 token range [start, end) of the segment inside its shard
    end: np.ndarray

    @property
    def num_rows(self) -> int:
        return self.row_ptr.size - 1


def plan_rows(documents, seq_len: int) -> RowPlan:
    """Greedy packing of documents (an iterable of (shard, start, end)) into rows of ``seq_len`` tokens."""
    if seq_len < 3:
        raise ValueError(f"seq_len={seq_len} must be >= 3 ([CLS] token [SEP])")
    row_ptr, shard, start, end = [0], [], [], []
    used = 0
    for si, s, e in documents:
        while s < e:
            room = seq_len - used
            if room < 3:
                row_ptr.append(len(shard))
                used, room = 0, seq_len
            n = min(e - s, room - 2)
            shard.append(si)
            start.append(s)
            end.append(s + n)
            used += n + 2
            s += n
    if used:
        row_ptr.append(len(shard))
    return RowPlan(
        np.asarray(row_ptr, dtype=np.int64),
        np.asarray(shard, dtype=np.int32),
        np.asarray(start, dtype=np.int64),
        np.asarray(end, dtype=np.int64),
    )


@dataclass
class Row:
    tokens: np.ndarray  # (n,) int64 with [CLS]/[SEP] around every segment, n <= seq_len (no padding)
    lengths: list[int]  # segment lengths, summing to n


class PackedDataset:
    """The rows of one split of a prepared directory."""

    def __init__(self, shards: ShardSet, seq_len: int):
        self.shards = shards
        self.seq_len = seq_len
        tok = shards.tokenizer
        self.cls_id, self.sep_id, self.pad_id = tok["cls_id"], tok["sep_id"], tok["pad_id"]
        self.plan = plan_rows(shards.documents(), seq_len)
        if self.plan.num_rows == 0:
            raise ValueError(f"{shards.directory} ({shards.split}) holds no tokens")

    def __len__(self) -> int:
        return self.plan.num_rows

    def row(self, r: int) -> Row:
        if not 0 <= r < len(self):
            raise IndexError(f"row {r} out of range [0, {len(self)})")
        p = self.plan
        parts, lengths = [], []
        for i in range(p.row_ptr[r], p.row_ptr[r + 1]):
            body = self.shards.shards[p.shard[i]].tokens[p.start[i] : p.end[i]]
            parts += [[self.cls_id], body, [self.sep_id]]
            lengths.append(int(body.size) + 2)
        return Row(np.concatenate([np.asarray(x, dtype=np.int64) for x in parts]), lengths)


def vocabulary_of(shards: ShardSet) -> Vocabulary:
    tok = shards.tokenizer
    return Vocabulary.build(tok["vocab_size"], tok["mask_id"], tok["special_ids"], shards.word_start())


class RowBatcher:
    """Masked batches of rows: ``batch(indices)`` for global sample indices (epoch-wrapped, shuffled)."""

    def __init__(
        self,
        data: PackedDataset,
        masking: MaskingConfig,
        vocab: Vocabulary,
        *,
        seed: int = 0,
        shuffle: bool = True,
        padding_free: bool = False,
    ):
        self.data, self.masking, self.vocab = data, masking, vocab
        self.seed, self.shuffle, self.padding_free = seed, shuffle, padding_free
        self._special = np.zeros(max(vocab.special_ids) + 1, dtype=bool)
        self._special[list(vocab.special_ids)] = True
        self._perm: tuple[int, np.ndarray] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.data))
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.data)))
        return self._perm[1]

    def is_special(self, tokens: np.ndarray) -> np.ndarray:
        inside = tokens < self._special.size
        return inside & self._special[np.where(inside, tokens, 0)]

    def sample(self, index: int) -> tuple[Row, np.ndarray, np.ndarray]:
        """Row, masked inputs and labels of the global sample ``index``."""
        epoch, pos = divmod(index, len(self.data))
        r = int(self._order(epoch)[pos])
        row = self.data.row(r)
        rng = np.random.default_rng([self.seed, epoch, r, 1])
        inputs, labels = mask_row(row.tokens, self.is_special(row.tokens), self.masking, self.vocab, rng)
        return row, inputs, labels

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        samples = [self.sample(i) for i in indices]
        return collate(samples, self.data.seq_len, self.data.pad_id, self.padding_free)


def collate(samples, seq_len: int, pad_id: int, padding_free: bool) -> dict[str, torch.Tensor]:
    """Rows -> model inputs. ``original_ids`` are the unmasked tokens (RTD labels are derived from them)."""
    if padding_free:
        inputs = np.concatenate([s[1] for s in samples])
        labels = np.concatenate([s[2] for s in samples])
        original = np.concatenate([s[0].tokens for s in samples])
        lengths = [n for s in samples for n in s[0].lengths]
        cu = np.concatenate([[0], np.cumsum(lengths)])
        return {
            "input_ids": torch.from_numpy(inputs)[None],
            "labels": torch.from_numpy(labels)[None],
            "original_ids": torch.from_numpy(original)[None],
            "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
        }
    b = len(samples)
    inputs = np.full((b, seq_len), pad_id, dtype=np.int64)
    labels = np.full((b, seq_len), IGNORE_INDEX, dtype=np.int64)
    original = np.full((b, seq_len), pad_id, dtype=np.int64)
    mask = np.zeros((b, seq_len), dtype=np.int64)
    for i, (row, x, y) in enumerate(samples):
        n = row.tokens.size
        inputs[i, :n], labels[i, :n], original[i, :n], mask[i, :n] = x, y, row.tokens, 1
    return {
        "input_ids": torch.from_numpy(inputs),
        "labels": torch.from_numpy(labels),
        "original_ids": torch.from_numpy(original),
        "attention_mask": torch.from_numpy(mask),
    }
