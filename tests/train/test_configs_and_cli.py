import json
from pathlib import Path

import pytest
import torch
import yaml

from debertakit import load_tokenizer
from debertakit.cli import main
from debertakit.objectives.rtd import generator_config
from debertakit.train.pretrain import PretrainConfig, model_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "pretrain").glob("*.yaml"))
TOKENIZER = {"vocab_size": 128001, "pad_id": 0, "cls_id": 1, "sep_id": 2, "mask_id": 128000}


def test_there_are_configs_for_the_released_sizes():
    names = {p.stem for p in CONFIGS}
    assert {"deberta-v3-xsmall", "deberta-v3-small", "deberta-v3-base", "deberta-v3-large"} <= names
    assert {"deberta-base-mlm", "tiny-rtd", "tiny-mlm"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_is_valid(path, capsys):
    cfg = PretrainConfig(**yaml.safe_load(path.read_text()))
    mcfg = model_config(cfg, TOKENIZER)
    assert mcfg.vocab_size >= TOKENIZER["vocab_size"]
    if cfg.objective == "rtd":
        assert generator_config(mcfg, cfg.generator_layers).num_layers == max(1, mcfg.num_layers // 2)
    # and the command line reads it with its types
    with pytest.raises(SystemExit):
        main(["pretrain", "--config", str(path), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["objective"] == cfg.objective and printed["max_steps"] == cfg.max_steps


def test_bad_options_name_the_value():
    with pytest.raises(ValueError, match="batch_size=0"):
        PretrainConfig(data="x", batch_size=0)
    with pytest.raises(ValueError, match="warmup_steps=20 exceeds max_steps=10"):
        PretrainConfig(data="x", warmup_steps=20, max_steps=10)
    with pytest.raises(ValueError, match="mask_prob=0"):
        PretrainConfig(data="x", mask_prob=0.0)
    with pytest.raises(ValueError, match="seq_len=1024 exceeds max_position_embeddings=512"):
        model_config(PretrainConfig(data="x", model="deberta-v3-base", seq_len=1024), TOKENIZER)


def test_pretrain_and_plot_commands(wikitext_shards, tmp_path, capsys):
    torch.set_num_threads(1)
    run = tmp_path / "run"
    main(
        [
            "pretrain",
            "--config",
            str(ROOT / "configs/pretrain/tiny-rtd.yaml"),
            "--data",
            str(wikitext_shards),
            "--out",
            str(run),
            "--max-steps",
            "4",
            "--warmup-steps",
            "1",
            "--log-every",
            "2",
            "--eval-every",
            "2",
            "--progress",
            "false",
        ]
    )
    out = capsys.readouterr().out
    assert "held-out" in out and "discriminator" in out
    for name in ("generator", "discriminator"):
        d = run / "final" / name
        assert (d / "config.json").exists() and (d / "model.safetensors").exists()
        assert (d / "spm.model").exists()  # the tokenizer travels with the model
        assert load_tokenizer(d).mask_token_id == 1000
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records] == ["train", "eval", "train", "eval"]
    main(["plot", str(run)])
    png = run / "curves.png"
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"
    # running the finished command again resumes at the end: nothing is trained twice
    main(
        [
            "pretrain",
            "--config",
            str(ROOT / "configs/pretrain/tiny-rtd.yaml"),
            "--data",
            str(wikitext_shards),
            "--out",
            str(run),
            "--max-steps",
            "4",
            "--warmup-steps",
            "1",
            "--progress",
            "false",
        ]
    )
    assert "resumed from" in capsys.readouterr().out
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4


def test_hugging_face_loads_the_saved_models(wikitext_shards, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    run = tmp_path / "run"
    main(
        [
            "pretrain",
            "--config",
            str(ROOT / "configs/pretrain/tiny-rtd.yaml"),
            "--data",
            str(wikitext_shards),
            "--out",
            str(run),
            "--max-steps",
            "1",
            "--warmup-steps",
            "0",
            "--progress",
            "false",
            "--eval-every",
            "0",
        ]
    )
    gen = transformers.AutoModelForMaskedLM.from_pretrained(run / "final" / "generator")
    disc = transformers.AutoModel.from_pretrained(run / "final" / "discriminator")
    ids = torch.tensor([[1, 10, 11, 12, 2]])
    assert gen(input_ids=ids).logits.shape[-1] == gen.config.vocab_size
    assert disc(input_ids=ids).last_hidden_state.shape == (1, 5, 64)
