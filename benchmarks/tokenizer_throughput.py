"""Encode throughput of our tokenizers against Hugging Face's fast tokenizers on the same vocabulary and file.

Both run in one process, alternating round by round, on the same lines (batched calls and one call per line).
SentencePiece: a vocabulary trained on the input file; BPE: GPT-2's files in the DeBERTa v1 layout.

    python benchmarks/tokenizer_throughput.py --file ../shared/data/text/wikitext-2-valid.txt

Prints a table and writes a JSON file (machine, versions, numbers).
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
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _time(fn, lines, batch_size):
    start = time.perf_counter()
    n_tokens = 0
    if batch_size == 1:
        for line in lines:
            n_tokens += len(fn(line)["input_ids"])
    else:
        for i in range(0, len(lines), batch_size):
            n_tokens += sum(len(r) for r in fn(lines[i : i + batch_size])["input_ids"])
    return time.perf_counter() - start, n_tokens


def _bench(name, ours, hf, lines, batch_size, rounds):
    times = {"ours": [], "hf": []}
    tokens = {}
    for _ in range(rounds):
        for key, tok in (("ours", ours), ("hf", hf)):
            seconds, tokens[key] = _time(tok, lines, batch_size)
            times[key].append(seconds)
    if tokens["ours"] != tokens["hf"]:
        print(f"note: {name}: token counts differ (ours {tokens['ours']}, hf {tokens['hf']})")
    row = {"vocabulary": name, "batch_size": batch_size, "lines": len(lines), "rounds": rounds}
    for key in ("ours", "hf"):
        t = statistics.median(times[key])
        row[key] = {
            "seconds_median": t,
            "lines_per_s": len(lines) / t,
            "tokens_per_s": tokens[key] / t,
            "tokens": tokens[key],
        }
    row["ratio_ours_over_hf"] = row["ours"]["lines_per_s"] / row["hf"]["lines_per_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(ROOT / "../shared/data/text/wikitext-2-valid.txt"))
    parser.add_argument("--bpe-dir", default=str(ROOT / "../shared/data/bpe-gpt2"))
    parser.add_argument("--spm-vocab-size", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/tokenizer_throughput.json"))
    args = parser.parse_args()

    import tokenizers
    import transformers

    from debertakit.tokenization import load_tokenizer, train_tokenizer

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    lines = [ln for ln in Path(args.file).read_text(encoding="utf-8").splitlines() if ln.strip()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        spm_dir, bpe_dir = Path(tmp) / "spm", Path(tmp) / "bpe"
        train_tokenizer([args.file], args.spm_vocab_size, "spm", spm_dir, progress=False)
        load_tokenizer(args.bpe_dir).save_pretrained(bpe_dir)
        pairs = [
            (
                f"spm (trained, {args.spm_vocab_size})",
                load_tokenizer(spm_dir),
                transformers.DebertaV2TokenizerFast.from_pretrained(str(spm_dir)),
            ),
            (
                "bpe (GPT-2, v1 layout)",
                load_tokenizer(bpe_dir),
                transformers.DebertaTokenizerFast.from_pretrained(str(bpe_dir)),
            ),
        ]
        for name, ours, hf in pairs:
            for batch_size in (args.batch_size, 1):
                rows.append(_bench(name, ours, hf, lines, batch_size, args.rounds))

    print(f"\n{len(lines)} lines of {Path(args.file).name}, median of {args.rounds} alternating rounds")
    header = f"{'vocabulary':28} {'batch':>6} {'ours lines/s':>13} {'hf lines/s':>11} {'ours tok/s':>11} {'hf tok/s':>11} {'ratio':>6}"
    print(header + "\n" + "-" * len(header))
    for r in rows:
        print(
            f"{r['vocabulary']:28} {r['batch_size']:>6} {r['ours']['lines_per_s']:>13,.0f} {r['hf']['lines_per_s']:>11,.0f} "
            f"{r['ours']['tokens_per_s']:>11,.0f} {r['hf']['tokens_per_s']:>11,.0f} {r['ratio_ours_over_hf']:>6.2f}"
        )
    result = {
        "benchmark": "tokenizer_throughput",
        "command": "python benchmarks/tokenizer_throughput.py " + " ".join(sys.argv[1:]),
        "file": os.path.relpath(args.file, ROOT),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "versions": {
            "python": platform.python_version(),
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
        },
        "results": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    main()
