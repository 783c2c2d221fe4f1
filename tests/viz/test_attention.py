"""`debertakit attention-map` writes a non-empty PNG, for one model or two side by side."""

from __future__ import annotations

import pytest
import torch

import debertakit
from debertakit.cli import main
from debertakit.experiments import variant_config
from debertakit.viz import pattern_stats

WORDS = "the cat sat on a mat while dogs ran far away from home and birds sang songs in green trees".split()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from debertakit.tokenization import train_tokenizer

    d = tmp_path_factory.mktemp("attn")
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(WORDS[i] for i in torch.randint(len(WORDS), (12,), generator=g)) for _ in range(300)]
    (d / "text.txt").write_text("\n".join(lines) + "\n")
    tok = train_tokenizer([d / "text.txt"], 40, "spm", d / "tok", progress=False)
    base = debertakit.DebertaConfig.preset("tiny-v3", vocab_size=tok.vocab_size)
    for name in ("full", "roberta"):
        debertakit.save_pretrained(debertakit.build_model(variant_config(base, name), "masked_lm"), d / name)
        tok.save_pretrained(d / name)
    return d


def _is_png(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_one_model_and_a_comparison(models, capsys):
    out = models / "one.png"
    main(
        [
            "attention-map",
            "--model",
            str(models / "full"),
            "--text",
            "the cat sat on a mat",
            "--out",
            str(out),
        ]
    )
    assert _is_png(out)
    out2 = models / "two.png"
    main(
        [
            "attention-map",
            "--model",
            str(models / "full"),
            "--compare",
            str(models / "roberta"),
            "--text",
            "dogs ran far away",
            "--layer",
            "0",
            "--head",
            "1",
            "--out",
            str(out2),
        ]
    )
    assert _is_png(out2) and out2.stat().st_size > out.stat().st_size
    printed = capsys.readouterr().out
    assert printed.count("self ") == 3  # one line of statistics per drawn model


def test_bad_head_is_named(models):
    with pytest.raises(ValueError, match="head 9 out of range"):
        main(
            [
                "attention-map",
                "--model",
                str(models / "full"),
                "--text",
                "the cat",
                "--head",
                "9",
                "--out",
                str(models / "x.png"),
            ]
        )


def test_pattern_stats():
    p = torch.eye(4)
    assert pattern_stats(p) == {"self": 1.0, "first_token": 0.25, "previous": 0.0, "next": 0.0}
    p = torch.zeros(3, 3)
    p[:, 0] = 1
    assert pattern_stats(p)["first_token"] == 1.0 and pattern_stats(p)["previous"] == pytest.approx(0.5)
