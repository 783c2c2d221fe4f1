"""Pretraining throughput (tokens/s) of debertakit against a Hugging Face transformers MLM loop, same model size.

Every contender trains on the same masked rows of WikiText-2 (15% of tokens, 80/10/10), with AdamW, gradient
clipping 1.0 and the same model shape (a DeBERTa-v3 layout, default: hidden 256, 4 layers, 4 heads, vocabulary
6000, 128 tokens per row, batch 8), one after another in one process, rounds interleaved:

* ``hf-mlm``: ``transformers.DebertaV2ForMaskedLM`` with labels (-100 elsewhere): its head scores every position;
* ``ours-mlm``: `debertakit` MLM objective (Enhanced Mask Decoder, only the masked positions are decoded);
* ``ours-mlm-packed``: the same, padding-free (one packed row with cu_seqlens);
* ``ours-rtd``: DeBERTa-v3 RTD + GDES (generator half the depth + discriminator): more work per token, shown
  for scale.

    python benchmarks/pretrain_throughput.py --threads 1

Prints a table and writes benchmarks/results/pretrain_throughput.json (machine, versions, numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _data(args, tmp: Path):
    from debertakit.data.masking import MaskingConfig
    from debertakit.data.packing import PackedDataset, RowBatcher, vocabulary_of
    from debertakit.data.shards import ShardSet, prepare_corpus
    from debertakit.tokenization import train_tokenizer

    train_tokenizer([args.corpus], args.vocab_size, "spm", str(tmp / "tok"), progress=False)
    prepare_corpus([args.corpus], str(tmp / "tok"), str(tmp / "shards"), workers=1, progress=False)
    shards = ShardSet(tmp / "shards")
    data = PackedDataset(shards, args.seq_len)
    vocab = vocabulary_of(shards)
    n = args.batch_size * (args.warmup + args.steps)
    dense = RowBatcher(data, MaskingConfig(), vocab, seed=0)
    rtd = RowBatcher(data, MaskingConfig().for_rtd(), vocab, seed=0)
    packed = RowBatcher(data, MaskingConfig(), vocab, seed=0, padding_free=True)
    idx = [list(range(i, i + args.batch_size)) for i in range(0, n, args.batch_size)]
    return (
        shards.tokenizer,
        [dense.batch(i) for i in idx],
        [packed.batch(i) for i in idx],
        [rtd.batch(i) for i in idx],
    )


def _model_config(args, tokenizer):
    from debertakit import DebertaConfig

    return DebertaConfig.preset(
        "small-v3",
        vocab_size=tokenizer["vocab_size"],
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=4 * args.hidden,
    )


def _step_fn(model, forward):
    import torch

    from debertakit.train.optim import build_optimizer

    opt = build_optimizer([p for p in model.parameters() if p.requires_grad], model, 1e-4)

    def step(batch):
        opt.zero_grad(set_to_none=True)
        loss = forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    return step


def contenders(args, tokenizer):
    import torch
    import transformers

    from debertakit.convert.hf_config import to_hf_config
    from debertakit.model.tasks import DebertaForMaskedLM, DebertaForReplacedTokenDetection
    from debertakit.objectives.mlm import MaskedLMObjective
    from debertakit.objectives.rtd import ReplacedTokenDetectionObjective, generator_config

    cfg = _model_config(args, tokenizer)
    torch.manual_seed(0)
    hf_cfg = transformers.DebertaV2Config(**to_hf_config(cfg, "masked_lm"))
    hf = transformers.DebertaV2ForMaskedLM(hf_cfg).train()
    ours = MaskedLMObjective(DebertaForMaskedLM(cfg)).train()
    rtd = ReplacedTokenDetectionObjective(
        DebertaForMaskedLM(generator_config(cfg)), DebertaForReplacedTokenDetection(cfg)
    ).train()
    return {
        "hf-mlm": (
            _step_fn(
                hf,
                lambda b: (
                    hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
                ),
            ),
            "dense",
        ),
        "ours-mlm": (_step_fn(ours, lambda b: ours(b)["loss"]), "dense"),
        "ours-mlm-packed": (_step_fn(ours, lambda b: ours(b)["loss"]), "packed"),
        "ours-rtd": (_step_fn(rtd, lambda b: rtd(b)["loss"]), "rtd"),
    }


def _tokens(batch) -> int:
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["cu_seqlens"][-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=str(ROOT.parent / "shared/data/text/wikitext-2-valid.txt"))
    p.add_argument("--vocab-size", type=int, default=6000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/pretrain_throughput.json"))
    args = p.parse_args()

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, dense, packed, rtd_batches = _data(args, Path(tmp))
    batches = {"dense": dense, "packed": packed, "rtd": rtd_batches}
    runs = contenders(args, tokenizer)
    speeds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (step, kind) in runs.items():
            data = batches[kind]
            for b in data[: args.warmup]:
                step(b)
            tokens, start = 0, time.perf_counter()
            for b in data[args.warmup :]:
                step(b)
                tokens += _tokens(b)
            speeds[name].append(tokens / (time.perf_counter() - start))
    base = statistics.median(speeds["hf-mlm"])
    rows = []
    print(f"{'contender':<18}{'tokens/s (median)':>20}{'vs hf-mlm':>12}   rounds")
    for name, xs in speeds.items():
        med = statistics.median(xs)
        rows.append({"contender": name, "tokens_per_s": med, "rounds": xs, "speedup_vs_hf": med / base})
        print(f"{name:<18}{med:>20.0f}{med / base:>11.2f}x   " + ", ".join(f"{x:.0f}" for x in xs))
    result = {
        "benchmark": "pretrain_throughput",
        "command": "python benchmarks/pretrain_throughput.py " + " ".join(sys.argv[1:]),
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "out"},
            "corpus": os.path.relpath(args.corpus, ROOT),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "device": "cpu",
            "load_average": os.getloadavg(),
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
