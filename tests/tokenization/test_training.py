"""Vocabulary training and the `debertakit tokenizer train` command."""

from __future__ import annotations

import pytest

from debertakit import cli
from debertakit.tokenization import load_tokenizer, train_tokenizer
from debertakit.tokenization.commands import tokenizer_commands


def _run_cli(monkeypatch, argv):
    # Only the tokenizer group, so this test does not depend on the other subcommands' imports.
    monkeypatch.setattr(cli, "_commands", lambda: {"tokenizer": tokenizer_commands()})
    cli.main(argv)


@pytest.mark.parametrize("kind", ["spm", "bpe"])
def test_cli_train_writes_a_loadable_directory(kind, monkeypatch, tmp_path, data_dir, capsys):
    files = f"[{data_dir / 'glue/SST-2/dev.tsv'},{data_dir / 'glue/CoLA/dev.tsv'}]"
    out = tmp_path / "tok"
    _run_cli(
        monkeypatch,
        ["tokenizer", "train", "--input", files, "--vocab-size", "600", "--kind", kind, "--out", str(out)],
    )
    assert "with 601 ids ([MASK] = 600)" in capsys.readouterr().out
    tok = load_tokenizer(out)
    assert tok.kind == kind and tok.vocab_size == 601 and tok.mask_token_id == 600
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    ids = tok.encode("To be, or not to be: that is the question.")
    assert ids[0] == 1 and ids[-1] == 2 and all(4 <= i < 600 for i in ids[1:-1])


def test_cli_single_input_file(monkeypatch, tmp_path, data_dir):
    out = tmp_path / "tok"
    _run_cli(
        monkeypatch,
        [
            "tokenizer",
            "train",
            "--input",
            str(data_dir / "glue/CoLA/dev.tsv"),
            "--vocab-size",
            "300",
            "--out",
            str(out),
        ],
    )
    assert load_tokenizer(out).vocab_size == 301


def test_training_errors(tmp_path, data_dir):
    text = data_dir / "glue/CoLA/dev.tsv"
    with pytest.raises(FileNotFoundError, match="training input not found"):
        train_tokenizer([tmp_path / "missing.txt"], 100, "spm", progress=False)
    with pytest.raises(ValueError, match=r"kind must be 'spm' or 'bpe', got 'wordpiece'"):
        train_tokenizer([text], 100, "wordpiece", progress=False)
    with pytest.raises(ValueError, match=r"vocab_size must be an int >= 260 for kind 'bpe', got 100"):
        train_tokenizer([text], 100, "bpe", progress=False)
    with pytest.raises(ValueError, match=r"SentencePiece training failed for vocab_size 500000"):
        train_tokenizer([text], 500_000, "spm", progress=False)


def test_spm_trained_in_memory_writes_nothing_until_saved(tmp_path, data_dir, monkeypatch):
    """Without `out` the model stays in memory (no temporary directory left behind); saving writes its bytes."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    tok = train_tokenizer([data_dir / "glue/CoLA/dev.tsv"], 300, "spm", progress=False)
    assert list((tmp_path / "tmp").iterdir()) == []
    tok.save_pretrained(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    text = "The more you read, the more you know."
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.vocab_size == tok.vocab_size == 301


def test_spm_from_bytes_rejects_bytes_that_are_no_model():
    from debertakit.tokenization.spm import spm_tokenizer_from_bytes

    with pytest.raises(ValueError, match="the given bytes is not a SentencePiece model file"):
        spm_tokenizer_from_bytes(b"\x00\x01not a model")
