"""Masking for pretraining: which tokens become targets, and what the model sees in their place.

* MLM (DeBERTa v1/v2, BERT): 15% of the (non-special) tokens are selected; of those 80% become [MASK], 10% a
  random token, 10% stay as they are (REFERENCE.md §1). Optional span masking (n-grams of up to 3 units, as
  the official ``NGramMaskGenerator``: a span of n units is drawn with probability proportional to 1/n) and
  whole-word masking (a unit is a word: a token that starts a word plus the tokens that continue it).
* RTD (DeBERTa-v3): the same selection, and every selected token becomes [MASK] (REFERENCE.md §2); the
  generator fills them in.

Masking is a pure function of (tokens, random generator). The data pipeline seeds the generator from
(seed, epoch, row), so masks are re-drawn every epoch, do not depend on batch composition or on the number of
processes, and need no state in a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100


@dataclass(frozen=True)
class MaskingConfig:
    """How targets are chosen and replaced.

    Args:
        mask_prob: fraction of the non-special tokens that become targets.
        mask_token_frac: of the targets, the fraction replaced by [MASK].
        random_token_frac: of the targets, the fraction replaced by a random regular token (the rest is kept).
        max_span: 1 = independent units; n > 1 = spans of 1..n consecutive units (probability ∝ 1/length).
        whole_word: a unit is a whole word instead of a token.
    """

    mask_prob: float = 0.15
    mask_token_frac: float = 0.8
    random_token_frac: float = 0.1
    max_span: int = 1
    whole_word: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob={self.mask_prob} must be in (0, 1)")
        for name in ("mask_token_frac", "random_token_frac"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1]")
        if self.mask_token_frac + self.random_token_frac > 1.0 + 1e-9:
            raise ValueError(
                f"mask_token_frac={self.mask_token_frac} + random_token_frac={self.random_token_frac} "
                "exceeds 1"
            )
        if self.max_span < 1:
            raise ValueError(f"max_span={self.max_span} must be >= 1 (1 = no span masking)")

    def for_rtd(self) -> MaskingConfig:
        """The same selection with every target replaced by [MASK] (DeBERTa-v3 RTD)."""
        return MaskingConfig(self.mask_prob, 1.0, 0.0, self.max_span, self.whole_word)


@dataclass(frozen=True)
class Vocabulary:
    """What masking needs to know about the token ids."""

    mask_id: int
    special_ids: tuple[int, ...]
    regular_ids: np.ndarray  # ids a random replacement may take (no special tokens)
    word_start: np.ndarray | None = None  # (V,) bool: the token begins a word (for whole-word masking)

    @classmethod
    def build(
        cls, vocab_size: int, mask_id: int, special_ids, word_start: np.ndarray | None = None
    ) -> Vocabulary:
        special = tuple(sorted({int(i) for i in special_ids} | {int(mask_id)}))
        regular = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), np.asarray(special, dtype=np.int64))
        if regular.size == 0:
            raise ValueError(f"vocabulary of size {vocab_size} has no regular (non-special) token")
        return cls(int(mask_id), special, regular, word_start)


def _units(candidates: np.ndarray, starts: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Maskable units as [begin, end) position ranges: single tokens, or words when ``starts`` is given."""
    pos = np.flatnonzero(candidates)
    if starts is None or pos.size == 0:
        return pos, pos + 1
    # a new unit begins at a word start or after a gap (a special token or the row's start)
    new = starts[pos].astype(bool)
    new[0] = True
    new[1:] |= np.diff(pos) > 1
    begins = pos[new]
    ends = np.append(pos[np.flatnonzero(new)[1:] - 1] + 1, pos[-1] + 1)
    return begins, ends


def _target_count(n: int, prob: float, rng: np.random.Generator) -> int:
    """n·prob with stochastic rounding (unbiased), at least one when there is anything to mask."""
    exact = n * prob
    count = int(exact) + int(rng.random() < exact - int(exact))
    return max(count, 1) if n > 0 else 0


def select_spans(
    tokens: np.ndarray,
    special: np.ndarray,
    cfg: MaskingConfig,
    rng: np.random.Generator,
    word_start: np.ndarray | None = None,
) -> list[tuple[int, int]]:
    """The masked spans of one row as [begin, end) position ranges (non-overlapping, never over a special
    token), covering about ``mask_prob`` of the non-special tokens.

    Args:
        tokens: (N,) token ids of one row.
        special: (N,) bool, True at [CLS]/[SEP]/[PAD]/… positions.
        cfg: masking options.
        rng: the generator (seeded per row and epoch by the caller).
        word_start: (V,) bool table, needed when ``cfg.whole_word``.
    """
    candidates = ~special
    target = _target_count(int(candidates.sum()), cfg.mask_prob, rng)
    if target == 0:
        return []
    if cfg.max_span == 1 and not cfg.whole_word:
        picked = np.sort(rng.choice(np.flatnonzero(candidates), size=target, replace=False))
        return [(int(p), int(p) + 1) for p in picked]
    if cfg.whole_word and word_start is None:
        raise ValueError("whole_word masking needs the vocabulary's word-start table (word_start.npy)")
    begins, ends = _units(candidates, word_start[tokens] if cfg.whole_word else None)
    lengths = np.arange(1, cfg.max_span + 1)
    span_p = (1.0 / lengths) / (1.0 / lengths).sum()  # as the official NGramMaskGenerator
    covered = np.zeros(begins.size, dtype=bool)
    spans, count = [], 0
    for u in rng.permutation(begins.size):
        if count >= target:
            break
        if covered[u]:
            continue
        span = int(rng.choice(lengths, p=span_p)) if cfg.max_span > 1 else 1
        last = u
        for j in range(u, min(u + span, begins.size)):
            contiguous = j == u or begins[j] == ends[j - 1]
            size = ends[j] - begins[j]
            if covered[j] or not contiguous or count + size > target:
                break
            covered[j] = True
            count += size
            last = j
        if covered[u]:
            spans.append((int(begins[u]), int(ends[last])))
    return sorted(spans)


def select_targets(
    tokens: np.ndarray,
    special: np.ndarray,
    cfg: MaskingConfig,
    rng: np.random.Generator,
    word_start: np.ndarray | None = None,
) -> np.ndarray:
    """(N,) bool: the positions that become targets (see `select_spans`)."""
    selected = np.zeros(tokens.shape[0], dtype=bool)
    for b, e in select_spans(tokens, special, cfg, rng, word_start):
        selected[b:e] = True
    return selected


def mask_row(
    tokens: np.ndarray,
    special: np.ndarray,
    cfg: MaskingConfig,
    vocab: Vocabulary,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Mask one row. Returns (inputs, labels): labels hold the original id at targets and -100 elsewhere."""
    selected = select_targets(tokens, special, cfg, rng, vocab.word_start)
    labels = np.where(selected, tokens, IGNORE_INDEX).astype(np.int64)
    inputs = tokens.astype(np.int64, copy=True)
    idx = np.flatnonzero(selected)
    u = rng.random(idx.size)
    to_mask = idx[u < cfg.mask_token_frac]
    to_random = idx[(u >= cfg.mask_token_frac) & (u < cfg.mask_token_frac + cfg.random_token_frac)]
    inputs[to_mask] = vocab.mask_id
    inputs[to_random] = vocab.regular_ids[rng.integers(0, vocab.regular_ids.size, size=to_random.size)]
    return inputs, labels
