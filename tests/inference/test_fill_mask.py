"""Fill-mask on a tiny random MLM model saved with a tokenizer trained here."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from debertakit import DebertaConfig, build_model, cli, load_pretrained, load_tokenizer, save_pretrained
from debertakit.inference import fill_mask
from debertakit.inference.fill_mask import fill_mask_command

DATA = (Path(__file__).resolve().parents[2] / "../shared/data").resolve()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    if not DATA.exists():
        pytest.skip(f"shared data not found: {DATA}")
    from debertakit.tokenization import train_tokenizer

    out = tmp_path_factory.mktemp("mlm")
    tok = train_tokenizer([DATA / "glue/CoLA/dev.tsv"], 400, "spm", progress=False)
    torch.manual_seed(0)
    # 416 rows for 401 ids: like v3 (128100 rows for 128001 ids), the extra rows belong to no token
    model = build_model(DebertaConfig.preset("tiny-v3", vocab_size=416), "masked_lm")
    save_pretrained(model, out, tokenizer=tok)
    return out


def test_directory_is_complete(model_dir):
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "spm.model", "tokenizer_config.json"} <= names
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    assert hf.mask_token_id == load_tokenizer(model_dir).mask_token_id == 400


def test_top_k_probabilities_match_the_model(model_dir):
    tok = load_tokenizer(model_dir)
    model = load_pretrained(model_dir, head="masked_lm")
    text = "The [MASK] sat on the [MASK] ."
    result = fill_mask(model, tok, text, top_k=4)
    assert len(result) == 2 and all(len(c) == 4 for c in result)
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc, decode_all=True).logits[0, :, : tok.vocab_size]  # (N, V)
    probs = torch.softmax(logits, -1)
    positions = (enc["input_ids"][0] == tok.mask_token_id).nonzero().flatten().tolist()
    for pos, candidates in zip(positions, result):
        want_p, want_i = probs[pos].topk(4)
        assert [c["token_id"] for c in candidates] == want_i.tolist()
        assert [c["score"] for c in candidates] == pytest.approx(want_p.tolist(), abs=1e-5)
        assert all(a["score"] >= b["score"] for a, b in zip(candidates, candidates[1:]))
        assert all(c["token_id"] < tok.vocab_size for c in candidates)
        assert candidates[0]["token"] == tok.convert_ids_to_tokens(candidates[0]["token_id"])


def test_batch_and_errors(model_dir):
    tok = load_tokenizer(model_dir)
    model = load_pretrained(model_dir, head="masked_lm")
    batch = fill_mask(model, tok, ["a [MASK] b", "one [MASK] two [MASK] three"], top_k=2)
    assert [len(r) for r in batch] == [1, 2]
    alone = fill_mask(model, tok, "a [MASK] b", top_k=2)
    assert [c["token_id"] for c in batch[0][0]] == [c["token_id"] for c in alone[0]]
    assert [c["score"] for c in batch[0][0]] == pytest.approx([c["score"] for c in alone[0]], abs=1e-5)
    with pytest.raises(ValueError, match=r"no \[MASK\] in text 0: 'no mask here'"):
        fill_mask(model, tok, "no mask here")
    with pytest.raises(ValueError, match=r"top_k must be an int in \[1, 401\], got 0"):
        fill_mask(model, tok, "a [MASK]", top_k=0)


def test_cli(model_dir, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_commands", lambda: {"fill-mask": fill_mask_command})
    cli.main(["fill-mask", "--model", str(model_dir), "--top-k", "3", "The [MASK] sat ."])
    out = capsys.readouterr().out
    assert out.startswith("[MASK] 0:") and out.count("(id ") == 3
