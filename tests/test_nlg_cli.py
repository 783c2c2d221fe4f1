"""`debertakit generate` and `debertakit perplexity` on a saved model directory with its tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

import debertakit
from debertakit.cli import main

WORDS = "the cat sat on a mat while dogs ran far away from home and birds sang songs in green trees".split()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from debertakit.tokenization import train_tokenizer

    d = tmp_path_factory.mktemp("nlg")
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(WORDS[i] for i in torch.randint(len(WORDS), (12,), generator=g)) for _ in range(300)]
    (d / "text.txt").write_text("\n".join(lines) + "\n")
    tok = train_tokenizer([d / "text.txt"], 40, "spm", d / "model", progress=False)
    cfg = debertakit.DebertaConfig.preset("tiny-v3", vocab_size=tok.vocab_size)
    debertakit.save_pretrained(debertakit.build_model(cfg, "masked_lm"), d / "model")
    return d


def test_generate_command(model_dir, capsys):
    args = ["generate", "--model", str(model_dir / "model"), "--prompt", "the cat", "--max-new-tokens", "6"]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first and first.startswith("the cat")
    main([*args, "--strategy", "top_p", "--top-p", "0.9", "--seed", "3"])
    assert capsys.readouterr().out.startswith("the cat")


def test_perplexity_command(model_dir, capsys):
    out = model_dir / "ppl.json"
    main(
        [
            "perplexity",
            "--model",
            str(model_dir / "model"),
            "--text",
            str(model_dir / "text.txt"),
            "--window",
            "32",
            "--max-tokens",
            "200",
            "--out",
            str(out),
        ]
    )
    res = json.loads(out.read_text())
    assert res["tokens"] == 200 and res["perplexity"] > 1.0
    assert res["nll_per_token"] == pytest.approx(__import__("math").log(res["perplexity"]))
    assert json.loads(capsys.readouterr().out)["tokens"] == 200
