import numpy as np
import pytest

from debertakit.data.masking import MaskingConfig
from debertakit.data.packing import PackedDataset, RowBatcher, plan_rows, vocabulary_of
from debertakit.data.shards import ShardSet

CLS, SEP = 1, 2


@pytest.mark.parametrize("seq_len", [8, 16, 64])
def test_plan_rows_fills_rows_and_keeps_every_token_in_order(seq_len):
    rng = np.random.default_rng(seq_len)
    lengths = rng.integers(1, 3 * seq_len, size=40)
    docs, start = [], 0
    for n in lengths:
        docs.append((0, start, start + int(n)))
        start += int(n)
    plan = plan_rows(docs, seq_len)
    seg_lengths = plan.end - plan.start + 2
    for r in range(plan.num_rows):
        used = int(seg_lengths[plan.row_ptr[r] : plan.row_ptr[r + 1]].sum())
        assert used <= seq_len
        if r < plan.num_rows - 1:
            assert seq_len - used < 3  # a row is padded only when [CLS] x [SEP] no longer fits
    # segments cover the documents' tokens exactly, in order, without gaps or overlaps
    covered = np.concatenate([np.arange(a, b) for a, b in zip(plan.start, plan.end)])
    assert (covered == np.arange(start)).all()


def test_rows_and_batches_respect_document_boundaries(wikitext_shards):
    shards = ShardSet(wikitext_shards)
    data = PackedDataset(shards, seq_len=64)
    docs = [shards.shards[s].tokens[a:b] for s, a, b in shards.documents()]
    bodies = []
    for r in range(len(data)):
        row = data.row(r)
        assert row.tokens.size == sum(row.lengths) <= 64
        at = 0
        for n in row.lengths:
            seg = row.tokens[at : at + n]
            assert seg[0] == CLS and seg[-1] == SEP and CLS not in seg[1:-1] and SEP not in seg[1:-1]
            bodies.append(seg[1:-1])
            at += n
    assert (np.concatenate(bodies) == np.concatenate(docs)).all()

    vocab = vocabulary_of(shards)
    packed = RowBatcher(data, MaskingConfig(), vocab, padding_free=True).batch([0, 1, 2])
    dense = RowBatcher(data, MaskingConfig(), vocab, padding_free=False).batch([0, 1, 2])
    cu = packed["cu_seqlens"].long()
    ids = packed["original_ids"][0]
    assert int(cu[-1]) == ids.numel() == int(dense["attention_mask"].sum())
    assert (ids[cu[:-1]] == CLS).all() and (ids[cu[1:] - 1] == SEP).all()
    # the same rows and masks, padded or packed
    real = dense["attention_mask"].bool()
    assert (dense["input_ids"][real] == packed["input_ids"][0]).all()
    assert (dense["labels"][real] == packed["labels"][0]).all()


def test_masks_are_redrawn_every_epoch_and_reproducible(wikitext_shards):
    shards = ShardSet(wikitext_shards)
    data = PackedDataset(shards, seq_len=64)
    batcher = RowBatcher(data, MaskingConfig(), vocabulary_of(shards), seed=7)
    n = len(data)
    first = batcher.batch(list(range(4)))
    assert (
        RowBatcher(data, MaskingConfig(), vocabulary_of(shards), seed=7).batch(list(range(4)))["labels"]
        == first["labels"]
    ).all()
    # the row read at position i of epoch 0 comes back in epoch 1 with another mask
    row0, _, labels0 = batcher.sample(0)
    order1 = batcher._order(1)
    pos = int(np.flatnonzero(order1 == batcher._order(0)[0])[0])
    row1, _, labels1 = batcher.sample(n + pos)
    assert (row0.tokens == row1.tokens).all()
    assert not (labels0 == labels1).all()
