import pytest
import torch

from debertakit import DebertaConfig, load_pretrained, save_pretrained
from debertakit.model.tasks import DebertaForMaskedLM, DebertaForReplacedTokenDetection
from debertakit.objectives.losses import IGNORE_INDEX
from debertakit.objectives.rtd import (
    ReplacedTokenDetectionObjective,
    generator_config,
    replaced_inputs,
    sample_replacements,
)

MASK = 4


def make(sharing="gdes", **overrides):
    cfg = DebertaConfig.preset("tiny-v3", hidden_dropout=0.0, attention_dropout=0.0, **overrides)
    gen = DebertaForMaskedLM(generator_config(cfg))
    return ReplacedTokenDetectionObjective(gen, DebertaForReplacedTokenDetection(cfg), sharing=sharing)


def batch(b=2, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    original = torch.randint(5, 128, (b, n), generator=g)
    original[:, 0], original[:, -1] = 1, 2
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, 8:] = 0
    original[1, 8:] = 0
    labels = torch.full((b, n), IGNORE_INDEX)
    labels[:, 2:5] = original[:, 2:5]
    inputs = original.clone()
    inputs[:, 2:5] = MASK
    return {"input_ids": inputs, "labels": labels, "original_ids": original, "attention_mask": mask}


def test_generator_is_half_depth_same_width():
    cfg = DebertaConfig.preset("deberta-v3-base")
    gen = generator_config(cfg)
    assert (gen.num_layers, gen.hidden_size) == (6, 768)
    narrow = generator_config(cfg, 4, hidden_size=256, num_heads=4, intermediate_size=1024)
    assert narrow.embedding_dim == 768 and narrow.num_layers == 4  # the embedding can still be shared


def test_gdes_rtd_gradient_reaches_delta_not_generator_embedding():
    obj = make("gdes")
    b = batch()
    ids, labels = replaced_inputs(
        b["original_ids"], b["labels"] != IGNORE_INDEX, torch.full((6,), 7), b["attention_mask"].bool()
    )
    logits, _ = obj.discriminator_logits(ids, {"attention_mask": b["attention_mask"]})
    keep = labels != IGNORE_INDEX
    rtd = torch.nn.functional.binary_cross_entropy_with_logits(logits[keep], labels[keep].float())
    gen_emb = obj.generator.deberta.embeddings.word.weight
    g_gen, g_delta = torch.autograd.grad(rtd, [gen_emb, obj.embedding_delta], allow_unused=True)
    assert g_gen is None, "the RTD loss reached the generator's embedding through GDES"
    assert g_delta is not None and g_delta.abs().sum() > 0
    # the whole loss: the generator embedding's gradient is the MLM loss's alone
    out = obj(b, generator=torch.Generator().manual_seed(0))
    (g_total,) = torch.autograd.grad(out["loss"], [gen_emb])
    mlm = obj.generator(input_ids=b["input_ids"], labels=b["labels"], attention_mask=b["attention_mask"])
    (g_mlm,) = torch.autograd.grad(mlm.loss, [gen_emb])
    torch.testing.assert_close(g_total, g_mlm, rtol=0, atol=0)


def test_plain_sharing_lets_rtd_reach_the_shared_embedding_and_none_separates():
    es = make("es")
    assert es.discriminator.deberta.embeddings.word is es.generator.deberta.embeddings.word
    out = es(batch(), generator=torch.Generator().manual_seed(0))
    (g,) = torch.autograd.grad(out["loss"] - out["mlm_loss"], [es.generator.deberta.embeddings.word.weight])
    assert g.abs().sum() > 0
    none = make("none")
    assert none.embedding_delta is None
    assert none.discriminator.deberta.embeddings.word is not none.generator.deberta.embeddings.word


def test_rtd_labels_a_sampled_original_counts_as_original():
    original = torch.tensor([[1, 10, 11, 12, 13, 2, 0]])
    select = torch.tensor([[False, True, True, True, False, False, False]])
    token_mask = torch.tensor([[True] * 6 + [False]])
    sampled = torch.tensor([10, 99, 12])  # the first and third samples equal the original
    ids, labels = replaced_inputs(original, select, sampled, token_mask)
    assert ids.tolist() == [[1, 10, 99, 12, 13, 2, 0]]
    assert labels.tolist() == [[0, 0, 1, 0, 0, 0, IGNORE_INDEX]]


def test_samples_follow_the_generator_softmax():
    logits = torch.full((3, 50), -1e4)
    logits[0, 7] = logits[1, 9] = 0.0
    logits[2, 3] = logits[2, 4] = 0.0
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_replacements(logits, g) for _ in range(400)])
    assert (draws[:, 0] == 7).all() and (draws[:, 1] == 9).all()
    share = (draws[:, 2] == 3).float().mean()
    assert set(draws[:, 2].tolist()) == {3, 4} and 0.4 < share < 0.6


def test_packed_rows_use_each_segments_cls():
    obj = make("gdes").eval()
    with torch.no_grad():
        obj.embedding_delta.normal_(0, 0.02)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(5, 128, (n,), generator=g) for n in (5, 9, 4)]
    for s in seqs:
        s[0], s[-1] = 1, 2
    packed = torch.cat(seqs)[None]
    cu = torch.tensor([0, 5, 14, 18], dtype=torch.int32)
    with torch.no_grad():
        logits, _ = obj.discriminator_logits(packed, {"cu_seqlens": cu})
        alone = torch.cat([obj.discriminator_logits(s[None], {})[0][0] for s in seqs])
    torch.testing.assert_close(logits[0], alone, atol=1e-5, rtol=1e-5)


def test_export_writes_generator_and_gdes_discriminator_embedding(tmp_path):
    obj = make("gdes")
    with torch.no_grad():
        obj.embedding_delta.normal_(0, 0.02)
    models = obj.export()
    for name, model in models.items():
        save_pretrained(model, tmp_path / name)
    disc = load_pretrained(tmp_path / "discriminator")
    gen = load_pretrained(tmp_path / "generator")
    expected = obj.generator.deberta.embeddings.word.weight + obj.embedding_delta
    torch.testing.assert_close(disc.deberta.embeddings.word.weight, expected.detach())
    assert disc.head_kind == "replaced_token_detection" and gen.head_kind == "masked_lm"
    assert gen.cfg.num_layers == 1
    b = batch()
    ids = b["original_ids"]
    with torch.no_grad():
        ours, _ = obj.eval().discriminator_logits(ids, {"attention_mask": b["attention_mask"]})
        reloaded = disc(input_ids=ids, attention_mask=b["attention_mask"]).logits
    torch.testing.assert_close(ours, reloaded, atol=1e-5, rtol=1e-5)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="sharing='both'"):
        make("both")
