"""`debertakit demo`: the README's main job, end to end on CPU in a few minutes.

1. a corpus from text already on the machine (WikiText-2 validation under ../shared/data/text when present, else
   Python's documentation sources from the python3-doc package, or the path given with ``--corpus``);
2. a SentencePiece vocabulary trained on it (`debertakit.tokenization.train_tokenizer`);
3. token shards (`debertakit prepare`);
4. a small DeBERTa-v3 pretrained with replaced-token detection and gradient-disentangled embedding sharing;
5. held-out evaluation (generator MLM loss/accuracy, discriminator accuracy/AUC);
6. the generator and the discriminator saved in Hugging Face form, with the tokenizer;
7. the training curves drawn to a PNG, and the generator filling in a [MASK].
"""

from __future__ import annotations

import glob
import json
import os
import time
from pathlib import Path

DEFAULT_CORPORA = (
    "../shared/data/text/wikitext-2-valid.txt",
    "/usr/share/doc/python3.11/html/_sources",
    "/usr/share/doc/python3/html/_sources",
)


def find_corpus(corpus: str | None) -> str:
    if corpus is not None:
        if not Path(corpus).exists():
            raise FileNotFoundError(
                f"corpus {corpus!r} does not exist; give a text file or a directory of them"
            )
        return corpus
    for candidate in DEFAULT_CORPORA:
        if Path(candidate).exists():
            return candidate
    found = glob.glob("/usr/share/doc/python3*/html/_sources")
    if found:
        return found[0]
    raise FileNotFoundError(
        "no text corpus found (looked for " + ", ".join(DEFAULT_CORPORA) + "); pass one with "
        "`debertakit demo --corpus FILE_OR_DIR` (any English text: a few MB is plenty)"
    )


def _corpus_files(corpus: str) -> list[str]:
    from debertakit.data.shards import input_files

    return [str(f) for f in input_files([corpus])]


def demo(
    *,
    corpus: str | None = None,
    out: str = "demo_out",
    steps: int = 300,
    vocab_size: int = 4000,
    threads: int | None = None,
) -> None:
    """Pretrain a small DeBERTa-v3 (RTD + GDES) from raw text on CPU, evaluate it, save it and plot it.

    Args:
        corpus: a text file or a directory of text files (default: text already on the machine).
        out: output directory (a run there is resumed).
        steps: optimizer steps.
        vocab_size: SentencePiece vocabulary size.
        threads: CPU threads (default: half the cores, at most 4).
    """
    import torch

    from debertakit import load_pretrained, load_tokenizer
    from debertakit.data.shards import prepare_corpus
    from debertakit.inference.fill_mask import fill_mask
    from debertakit.tokenization import train_tokenizer
    from debertakit.train.pretrain import PretrainConfig, pretrain
    from debertakit.viz.curves import plot_curves, read_metrics

    threads = threads or max(1, min(4, (os.cpu_count() or 2) // 2))
    torch.set_num_threads(threads)
    out_dir = Path(out)
    timings: dict[str, float] = {}
    start = time.perf_counter()

    def phase(name: str, t0: float) -> None:
        timings[name] = time.perf_counter() - t0

    source = find_corpus(corpus)
    files = _corpus_files(source)
    size = sum(Path(f).stat().st_size for f in files)
    print(f"[1/6] corpus: {source} ({len(files)} file(s), {size / 2**20:.1f} MB)")

    t0 = time.perf_counter()
    tok_dir = out_dir / "tokenizer"
    if not (tok_dir / "spm.model").exists():
        train_tokenizer(files, vocab_size, "spm", str(tok_dir), max_sentences=200_000, progress=False)
    phase("vocabulary", t0)
    print(f"[2/6] SentencePiece vocabulary of {vocab_size} pieces: {tok_dir} ({timings['vocabulary']:.1f} s)")

    t0 = time.perf_counter()
    report = prepare_corpus(
        files, str(tok_dir), str(out_dir / "shards"), valid_fraction=0.02, workers=2, progress=False
    )
    phase("shards", t0)
    print(
        f"[3/6] shards: {report.train_tokens:,} training tokens in {report.train_documents:,} documents, "
        f"{report.valid_tokens:,} held out ({timings['shards']:.1f} s); bad input: {report.bad or 'none'}"
    )

    cfg = PretrainConfig(
        data=str(out_dir / "shards"),
        out=str(out_dir / "run"),
        objective="rtd",
        model="small-v3",
        model_overrides={"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 512},
        sharing="gdes",
        rtd_weight=10.0,
        seq_len=128,
        batch_size=8,
        lr=1e-3,
        warmup_steps=max(1, steps // 10),
        max_steps=steps,
        log_every=10,
        eval_every=max(1, steps // 3),
        eval_rows=64,
        save_every=max(1, steps // 3),
        num_threads=threads,
        seed=0,
    )
    print(
        f"[4/6] pretraining a DeBERTa-v3 (hidden 128, 4 layers; generator 2 layers) with RTD + GDES, "
        f"{steps} steps of {cfg.batch_size} x {cfg.seq_len} tokens, {threads} thread(s)"
    )
    t0 = time.perf_counter()
    result = pretrain(cfg)
    phase("pretraining", t0)

    t0 = time.perf_counter()
    png = plot_curves(cfg.out)
    phase("plot", t0)

    train = [r for r in read_metrics(cfg.out) if r["split"] == "train"]
    first, last = train[0], train[-1]
    ev = result.get("eval", {})
    print(f"[5/6] trained in {timings['pretraining']:.0f} s")
    print(
        f"      generator MLM loss {first['mlm_loss']:.2f} -> {last['mlm_loss']:.2f}, "
        f"discriminator RTD loss {first['rtd_loss']:.3f} -> {last['rtd_loss']:.3f} "
        f"(steps {first['step']} -> {last['step']}, means over {cfg.log_every} steps)"
    )
    if ev:
        print(
            f"      held out: MLM loss {ev['mlm_loss']:.2f}, MLM accuracy {ev['mlm_accuracy']:.3f}, "
            f"RTD accuracy {ev['rtd_accuracy']:.3f}, RTD AUC {ev['rtd_auc']:.3f}"
        )

    gen_dir = Path(result["models"]["generator"])
    generator = load_pretrained(gen_dir)
    tokenizer = load_tokenizer(gen_dir)
    text = "The first season of the [MASK] was released in 2010 ."
    guesses = fill_mask(generator, tokenizer, text, top_k=5)[0]
    print(f"[6/6] the generator fills in: {text!r} -> {[g['text'] for g in guesses]}")

    total = time.perf_counter() - start
    summary = {
        "corpus": source,
        "seconds": {**{k: round(v, 1) for k, v in timings.items()}, "total": round(total, 1)},
        "first_train_log": first,
        "last_train_log": last,
        "eval": ev,
        "models": result["models"],
        "curves": str(png),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print()
    print(f"done in {total / 60:.1f} min. Everything is under {out_dir}/:")
    print(f"  tokenizer       {tok_dir}")
    print(f"  shards          {out_dir / 'shards'} (manifest.json)")
    print(f"  metrics         {Path(cfg.out) / 'metrics.jsonl'}")
    print(f"  checkpoints     {Path(cfg.out) / 'checkpoints'} (run the demo again to resume or reuse)")
    print(f"  generator       {result['models']['generator']}  (Hugging Face: AutoModelForMaskedLM)")
    print(f"  discriminator   {result['models']['discriminator']}  (replaced-token detection head)")
    print(f"  curves          {png}")
    print(f"  summary         {out_dir / 'summary.json'}")
