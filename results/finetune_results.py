"""Fine-tuning results: runs the commands below (skipping rows whose summary exists) and writes finetune.md and
finetune.json from the run files. Run from the repository root: `python results/finetune_results.py [--only]`
(`--only` rebuilds the table from existing runs without training; `--part=I/N` runs every N-th row from row I,
for N processes side by side)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

D = "../shared/data"
MODEL = "runs/pretrain-small/final/discriminator"
COMMON = (
    f"--model {MODEL} --epochs 3 --batch-size 16 --lr 1e-3 --seeds 1,2,3 --num-threads 1 --progress false"
)

TASKS = [
    (
        "sst2",
        f"--train {D}/glue/SST-2/train.tsv --dev {D}/glue/SST-2/dev.tsv --train-limit 1000 --max-length 64",
    ),
    (
        "cola",
        f"--train {D}/glue/CoLA/train.tsv --dev {D}/glue/CoLA/dev.tsv --train-limit 1000 --max-length 64",
    ),
    (
        "mrpc",
        f"--train {D}/glue/MRPC/msr_paraphrase_train.txt --dev {D}/glue/MRPC/msr_paraphrase_test.txt "
        "--train-limit 1000 --dev-limit 500 --max-length 128",
    ),
    ("rte", f"--train {D}/glue/RTE/train.tsv --dev {D}/glue/RTE/dev.tsv --train-limit 1000 --max-length 128"),
    (
        "stsb",
        f"--train {D}/glue/STS-B/train.tsv --dev {D}/glue/STS-B/dev.tsv --train-limit 1000 --dev-limit 500 "
        "--max-length 64",
    ),
    (
        "squad",
        f"--train {D}/squad/dev-v1.1-part1.json --dev {D}/squad/dev-v1.1-part1.json --train-limit 512 "
        "--dev-offset 3000 --dev-limit 300 --max-length 160 --doc-stride 48",
    ),
    (
        "conll2003",
        f"--train {D}/conll2003/eng.train --dev {D}/conll2003/eng.testa --train-limit 1000 --dev-limit 500 "
        "--max-length 128",
    ),
]


def command(task: str, args: str, sift: bool) -> str:
    out = f"runs/ft/{task}/{'sift' if sift else 'base'}"
    return (
        f"python -m debertakit finetune --task {task} {args} {COMMON}{' --sift' if sift else ''} --out {out}"
    )


def main() -> None:
    only = "--only" in sys.argv
    part = next((a.split("=")[1] for a in sys.argv if a.startswith("--part=")), "0/1")
    index, parts = (int(x) for x in part.split("/"))
    rows = []
    for i, (task, args) in enumerate(TASKS):
        for sift in (False, True):
            cmd = command(task, args, sift)
            out = Path(cmd.split("--out ")[1])
            mine = (i + sift) % parts == index
            if not (out / "summary.json").exists() and not only and mine:
                print(f"$ {cmd}", flush=True)
                subprocess.run([sys.executable, *shlex.split(cmd)[1:]], check=True)
            rows.append(row(task, sift, cmd, out))
            rows[-1]["majority"] = majority_baseline(task, args)
    Path("results/finetune.json").write_text(json.dumps(rows, indent=2) + "\n")
    text = table(rows)
    print(text)
    commands = "\n".join(f"{r['task']} {'SiFT' if r['sift'] else 'base'}:\n    {r['command']}" for r in rows)
    doc = Path("results/finetune.md").read_text() if Path("results/finetune.md").exists() else ""
    start, end = "<!-- table -->", "<!-- /table -->"
    if start in doc and end in doc:
        head, rest = doc.split(start, 1)
        tail = rest.split(end, 1)[1]
        doc = f"{head}{start}\n{text}\n{end}{tail}"
    start, end = "<!-- commands -->", "<!-- /commands -->"
    if start in doc and end in doc:
        head, rest = doc.split(start, 1)
        tail = rest.split(end, 1)[1]
        doc = f"{head}{start}\n```\n{commands}\n```\n{end}{tail}"
    Path("results/finetune.md").write_text(doc)
    readme = Path("README.md").read_text()
    start, end = "<!-- finetune-table -->", "<!-- /finetune-table -->"
    if start in readme and end in readme:
        head, rest = readme.split(start, 1)
        Path("README.md").write_text(f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}")


def row(task: str, sift: bool, cmd: str, out: Path) -> dict:
    r = {"task": task, "sift": sift, "command": cmd, "runs": []}
    if not (out / "summary.json").exists():
        return r
    summary = json.loads((out / "summary.json").read_text())["summary"]
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    r["runs"] = [
        {
            k: x[k]
            for k in ("seed", "metrics", "best_step", "steps", "train_examples", "dev_examples", "seconds")
        }
        for x in runs
    ]
    r["main_metric"] = runs[0]["main_metric"]
    r["summary"] = summary
    return r


def majority_baseline(task: str, args: str) -> dict[str, float] | None:
    """The dev metrics of always answering the most frequent label of the training subset (no model)."""
    from collections import Counter

    from debertakit.data.tasks import get_task
    from debertakit.evaluate.metrics import task_metrics

    spec = get_task(task)
    if spec.kind != "classification":
        return None
    opts = dict(zip(shlex.split(args)[::2], shlex.split(args)[1::2]))
    train = spec.read(opts["--train"]).examples[: int(opts["--train-limit"])]
    limit = int(opts["--dev-limit"]) if "--dev-limit" in opts else None
    dev = spec.read(opts["--dev"]).examples[:limit]
    label = Counter(e.label for e in train).most_common(1)[0][0]
    return task_metrics(task, [label] * len(dev), [e.label for e in dev])


def table(rows: list[dict]) -> str:
    lines = [
        "| task | SiFT | metric | mean | min | max | per seed | train / dev examples | steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["sift"] and r.get("majority"):
            for name in metrics_of(r["task"]):
                lines.append(
                    f"| {r['task']} | majority class, no model | {name} | {r['majority'][name] * 100:.1f} | | | | | |"
                )
        if not r["runs"]:
            lines.append(f"| {r['task']} | {'yes' if r['sift'] else 'no'} | not run | | | | | | |")
            continue
        for name in metrics_of(r["task"]):
            s = r["summary"][name]
            scale = 1 if r["task"] == "squad" else 100
            per = ", ".join(f"{v * scale:.1f}" for v in s["values"])
            sizes = f"{r['runs'][0]['train_examples']} / {r['runs'][0]['dev_examples']}"
            lines.append(
                f"| {r['task']} | {'yes' if r['sift'] else 'no'} | {name} | {s['mean'] * scale:.1f} | "
                f"{s['min'] * scale:.1f} | {s['max'] * scale:.1f} | {per} | {sizes} | {r['runs'][0]['steps']} |"
            )
    return "\n".join(lines)


def metrics_of(task: str) -> list[str]:
    return {
        "cola": ["mcc"],
        "stsb": ["pearson", "spearman"],
        "mrpc": ["accuracy", "f1"],
        "squad": ["exact_match", "f1"],
        "conll2003": ["f1"],
    }.get(task, ["accuracy"])


if __name__ == "__main__":
    main()
