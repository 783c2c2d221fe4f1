"""`debertakit experiment ablation|nlg --config FILE.yaml`: train every variant with several seeds on the same
shards with the same budget, evaluate, and write a table with significance tests plus plots.

Layout of the experiment directory (``out`` in the config)::

    tokenizer/, shards/          built from ``corpus`` when the config gives no ``data`` (resumable)
    runs/NAME/seed-S/            one pretraining run each (checkpoints, metrics.jsonl, final/ models)
    runs/NAME/seed-S/result.json written last: a run with it is finished and skipped next time
    runs/NAME/seed-S/finetune-T/ a fine-tuning run of the pretrained model on task T (its own result.json)
    results.json, results.md     the table: mean ± std over seeds, difference to the reference, Welch and
                                 Mann-Whitney p-values (`debertakit.evaluate.significance.compare_runs`)
    figures/*.png                bars per metric, mean training curves per variant

Resuming: run the same command again. Finished runs are skipped; a run that stopped half-way resumes from its
latest checkpoint (the pretraining loop's exact resume); the table is rebuilt from every finished run.

Evaluation per run: the pretraining loop's held-out metrics at the end (MLM loss/accuracy; for causal and MT
runs the next-token loss, accuracy and perplexity; for RTD runs the *generator's* MLM metrics and the
discriminator's RTD metrics); when ``probe`` is configured, a linear probe: logistic regression on the
frozen mean-pooled last hidden states of a GLUE sentence task; when ``finetune`` is configured, one fine-tuning
run per task (`debertakit.train.finetune`, resumable too) whose dev metrics join the table as ``T_metric``.
RTD runs are probed and fine-tuned through their discriminator. Evaluations added to the config later are run
for the runs already finished.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from debertakit.convert.checkpoint import atomic_write_text


@dataclass
class RunSpec:
    """One row of the table: a name, an ablation variant, a training objective and, rarely, its own
    pretraining options (e.g. more steps), which override the shared ones."""

    name: str
    variant: str = "full"
    objective: str | None = None  # None: the variant's own (mlm, or rtd for the "rtd" variant)
    pretrain: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProbeConfig:
    """Linear probe on a GLUE single-sentence task (``sentence<TAB>label`` with a header, as SST-2)."""

    train: str
    dev: str
    train_examples: int = 2000
    max_length: int = 64
    name: str = "probe"


@dataclass
class ExperimentConfig:
    """An experiment file (configs/experiments/*.yaml).

    Args:
        out: experiment directory.
        runs: the rows: variant names (``full``, ``no-c2p``, ...) or ``{name, variant, objective, pretrain}``.
        seeds: one run per seed and row.
        reference: the row every other is compared with.
        pretrain: `PretrainConfig` fields shared by every run (model, sizes, steps, learning rate, ...).
        data: prepared shards (``debertakit prepare``); or None to build them from ``corpus``.
        corpus: text files to train a tokenizer on and prepare (when ``data`` is None).
        vocab_size: size of that tokenizer.
        valid_fraction: held-out share of the corpus.
        metrics: metrics of the table (default: every metric the runs report).
        probe: optional linear probe.
        finetune: optional fine-tuning tasks: ``{name: {FinetuneConfig fields: task, train, dev, ...}}``.
        stop_after_runs: train at most this many runs in this invocation (resume later).
    """

    out: str
    runs: list[Any]
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    reference: str = "full"
    pretrain: dict[str, Any] = field(default_factory=dict)
    data: str | None = None
    corpus: list[str] = field(default_factory=list)
    vocab_size: int = 2000
    valid_fraction: float = 0.05
    metrics: list[str] | None = None
    probe: dict[str, Any] | None = None
    finetune: dict[str, dict[str, Any]] | None = None
    stop_after_runs: int | None = None

    def specs(self) -> list[RunSpec]:
        out = []
        for r in self.runs:
            spec = RunSpec(r, r) if isinstance(r, str) else RunSpec(**r)
            from debertakit.experiments.variants import get_variant

            get_variant(spec.variant)  # validates
            out.append(spec)
        names = [s.name for s in out]
        if len(set(names)) != len(names):
            raise ValueError(f"run names repeat: {names}")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not one of the runs {names}")
        return out

    @classmethod
    def load(cls, path: str | Path) -> ExperimentConfig:
        import yaml

        raw = yaml.safe_load(Path(path).read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(raw) - known)
        if bad:
            raise ValueError(f"{path}: unknown field(s) {bad}; expected some of {sorted(known)}")
        return cls(**raw)


# ---------------------------------------------------------------------------------------------------- data
def ensure_data(cfg: ExperimentConfig) -> str:
    if cfg.data is not None:
        return cfg.data
    if not cfg.corpus:
        raise ValueError("the experiment needs either data (prepared shards) or corpus (text files)")
    from debertakit.data.shards import prepare_corpus
    from debertakit.tokenization import train_tokenizer

    out = Path(cfg.out)
    tok_dir = out / "tokenizer"
    if not (tok_dir / "spm.model").exists():
        train_tokenizer(cfg.corpus, cfg.vocab_size, "spm", tok_dir, progress=False)
    shards = out / "shards"
    prepare_corpus(
        list(cfg.corpus),
        str(tok_dir),
        str(shards),
        valid_fraction=cfg.valid_fraction,
        workers=1,
        progress=False,
    )
    return str(shards)


# ---------------------------------------------------------------------------------------------------- one run
def run_dir(cfg: ExperimentConfig, spec: RunSpec, seed: int) -> Path:
    return Path(cfg.out) / "runs" / spec.name / f"seed-{seed}"


def train_run(cfg: ExperimentConfig, spec: RunSpec, seed: int, data: str) -> dict[str, Any] | None:
    """Train (or resume) one run; returns its result, or None when it stopped before the end."""
    from debertakit.experiments.variants import get_variant
    from debertakit.train.pretrain import PretrainConfig, pretrain

    variant = get_variant(spec.variant)
    objective = spec.objective or variant.objective
    d = run_dir(cfg, spec, seed)
    options = {"progress": False, "tensorboard": False, **cfg.pretrain, **spec.pretrain}
    pcfg = PretrainConfig(
        data=data, out=str(d), objective=objective, variant=spec.variant, seed=seed, **options
    )
    result = pretrain(pcfg)
    if result.get("stopped"):
        return None
    metrics = dict(result.get("eval", {}))
    if cfg.probe:
        metrics.update(linear_probe(_encoder_dir(d), ProbeConfig(**cfg.probe), seed))
    out = {
        "name": spec.name,
        "variant": spec.variant,
        "objective": objective,
        "seed": seed,
        "metrics": metrics,
    }
    atomic_write_text(d / "result.json", json.dumps(out, indent=2) + "\n")
    return out


def _encoder_dir(d: Path) -> str:
    """The model a run hands to downstream tasks: the discriminator of an RTD run, else the model."""
    disc = d / "final" / "discriminator"
    return str(disc if disc.is_dir() else d / "final" / "model")


def finetune_run(cfg: ExperimentConfig, spec: RunSpec, seed: int, task: str) -> dict[str, float] | None:
    """Fine-tune a finished run's model on one configured task (resumes; a finished one is read back)."""
    from debertakit.train.finetune import FinetuneConfig, finetune

    out = run_dir(cfg, spec, seed) / f"finetune-{task}"
    if not (out / "result.json").exists():
        options = {"progress": False, **cfg.finetune[task]}
        result = finetune(
            FinetuneConfig(model=_encoder_dir(run_dir(cfg, spec, seed)), out=str(out), seed=seed, **options)
        )
        if result.get("stopped"):
            return None
    result = json.loads((out / "result.json").read_text())
    return {f"{task}_{k}": v for k, v in result["metrics"].items() if isinstance(v, (int, float))}


def _read_sentences(path: str, limit: int | None) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    with open(path, encoding="utf-8") as fh:
        next(fh)  # header
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 2 and parts[-1].strip().isdigit():
                texts.append(parts[0])
                labels.append(int(parts[-1]))
            if limit is not None and len(texts) >= limit:
                break
    return texts, labels


def linear_probe(model_dir: str, probe: ProbeConfig, seed: int) -> dict[str, float]:
    """Accuracy of a logistic regression on frozen mean-pooled features (train subset -> dev)."""
    import numpy as np
    import torch
    from sklearn.linear_model import LogisticRegression

    import debertakit

    model = debertakit.load_pretrained(model_dir, "base")
    tok = debertakit.load_tokenizer(model_dir)

    @torch.no_grad()
    def features(texts: list[str]) -> np.ndarray:
        rows = []
        for i in range(0, len(texts), 64):
            enc = tok(
                texts[i : i + 64],
                padding=True,
                truncation=True,
                max_length=probe.max_length,
                return_tensors="pt",
            )
            mask = enc["attention_mask"]
            h = model(input_ids=enc["input_ids"], attention_mask=mask).last_hidden_state
            rows.append(((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).numpy())
        return np.concatenate(rows)

    xt, yt = _read_sentences(probe.train, probe.train_examples)
    xd, yd = _read_sentences(probe.dev, None)
    clf = LogisticRegression(max_iter=2000, random_state=seed).fit(features(xt), yt)
    return {f"{probe.name}_accuracy": float(clf.score(features(xd), yd))}


# ---------------------------------------------------------------------------------------------------- the table
def collect(cfg: ExperimentConfig, specs: list[RunSpec]) -> dict[str, list[dict[str, float]]]:
    """Metrics of every finished run (pretraining result + finished fine-tuning results)."""
    runs: dict[str, list[dict[str, float]]] = {}
    for spec in specs:
        for seed in cfg.seeds:
            d = run_dir(cfg, spec, seed)
            if not (d / "result.json").exists():
                continue
            metrics = dict(json.loads((d / "result.json").read_text())["metrics"])
            for task in cfg.finetune or {}:
                path = d / f"finetune-{task}" / "result.json"
                if path.exists():
                    res = json.loads(path.read_text())["metrics"]
                    metrics.update({f"{task}_{k}": v for k, v in res.items() if isinstance(v, (int, float))})
            runs.setdefault(spec.name, []).append(metrics)
    return runs


def _fmt(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def build_table(cfg: ExperimentConfig, specs: list[RunSpec]) -> dict[str, Any]:
    """Mean ± std per row and metric, and each row's difference to the reference with p-values."""
    from debertakit.evaluate.significance import compare_runs, summarise

    runs = collect(cfg, specs)
    ref = runs.get(cfg.reference, [])
    names = [s.name for s in specs if s.name in runs]
    metrics = cfg.metrics or list(dict.fromkeys(k for n in names for r in runs[n] for k in r))
    rows = []
    for spec in specs:
        if spec.name not in runs:
            continue
        summ = summarise(runs[spec.name])
        row = {
            "name": spec.name,
            "variant": spec.variant,
            "objective": spec.objective,
            "n": len(runs[spec.name]),
            "metrics": {},
        }
        shared = [m for m in metrics if m in summ and ref and m in summarise(ref)]
        comparisons = (
            {c.metric: c for c in compare_runs(ref, runs[spec.name], metrics=shared)}
            if shared and spec.name != cfg.reference
            else {}
        )
        for m in metrics:
            if m not in summ:
                continue
            s = summ[m]
            entry = {"mean": s.mean, "std": s.std, "values": list(s.values)}
            if m in comparisons:
                c = comparisons[m]
                entry.update(difference=c.difference, welch_p=c.welch_p, mannwhitney_p=c.mannwhitney_p)
            row["metrics"][m] = entry
        rows.append(row)
    return {
        "reference": cfg.reference,
        "seeds": cfg.seeds,
        "metrics": metrics,
        "rows": rows,
        "pretrain": cfg.pretrain,
    }


def table_markdown(table: dict[str, Any]) -> str:
    metrics = table["metrics"]
    head = (
        "| run | n | "
        + " | ".join(f"{m} (mean ± std) | Δ vs {table['reference']} (p Welch / MW)" for m in metrics)
        + " |"
    )
    sep = "|" + "---|" * (2 + 2 * len(metrics))
    lines = [head, sep]
    for row in table["rows"]:
        cells = [row["name"], str(row["n"])]
        for m in metrics:
            e = row["metrics"].get(m)
            if e is None:
                cells += ["", ""]
                continue
            cells.append(f"{_fmt(e['mean'])} ± {_fmt(e['std'])}")
            if "difference" in e:
                cells.append(
                    f"{e['difference']:+.4f} ({_fmt(e['welch_p'], 3)} / {_fmt(e['mannwhitney_p'], 3)})"
                )
            else:
                cells.append("—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- plots
def plot_table(table: dict[str, Any], out_dir: Path) -> list[Path]:
    """One bar chart per metric (mean ± std over seeds, every seed as a dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for m in table["metrics"]:
        rows = [r for r in table["rows"] if m in r["metrics"]]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(1.1 * len(rows) + 2, 3.6))
        x = range(len(rows))
        means = [r["metrics"][m]["mean"] for r in rows]
        stds = [0 if math.isnan(r["metrics"][m]["std"]) else r["metrics"][m]["std"] for r in rows]
        ax.bar(
            x,
            means,
            yerr=stds,
            capsize=4,
            color=["tab:blue" if r["name"] == table["reference"] else "tab:gray" for r in rows],
        )
        for i, r in enumerate(rows):
            vals = r["metrics"][m]["values"]
            ax.plot([i] * len(vals), vals, "k.", ms=4)
        lo = min(min(r["metrics"][m]["values"]) for r in rows)
        hi = max(max(r["metrics"][m]["values"]) for r in rows)
        pad = (hi - lo) * 0.3 or abs(hi) * 0.05 or 1.0
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xticks(list(x), [r["name"] for r in rows], rotation=30, ha="right")
        ax.set_title(f"{m}: mean ± std over seeds")
        fig.tight_layout()
        p = out_dir / f"{m}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def plot_curves(cfg: ExperimentConfig, specs: list[RunSpec], key: str, out: Path) -> Path | None:
    """Training curve of ``key`` per row (mean over the finished seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for spec in specs:
        curves = []
        for seed in cfg.seeds:
            path = run_dir(cfg, spec, seed) / "metrics.jsonl"
            if not (run_dir(cfg, spec, seed) / "result.json").exists():
                continue
            recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            pts = [(r["step"], r[key]) for r in recs if r["split"] == "train" and key in r]
            if pts:
                curves.append(pts)
        if not curves:
            continue
        n = min(len(c) for c in curves)
        steps = [s for s, _ in curves[0][:n]]
        mean = np.mean([[v for _, v in c[:n]] for c in curves], axis=0)
        ax.plot(steps, mean, label=spec.name, lw=2 if spec.name == cfg.reference else 1)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel(f"train {key}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------------- the experiment
def run_experiment(cfg: ExperimentConfig) -> dict[str, Any]:
    """Train what is not finished, then write results.json / results.md / figures. Returns a summary."""
    specs = cfg.specs()
    data = ensure_data(cfg)
    trained, skipped, pending = [], [], []
    for seed in cfg.seeds:  # seed-major: every row gets its first seed before any gets a second
        for spec in specs:
            key = f"{spec.name}/seed-{seed}"
            if (run_dir(cfg, spec, seed) / "result.json").exists():
                skipped.append(key)
                continue
            if cfg.stop_after_runs is not None and len(trained) >= cfg.stop_after_runs:
                pending.append(key)
                continue
            if train_run(cfg, spec, seed, data) is None:
                pending.append(key)
            else:
                trained.append(key)
    for seed in cfg.seeds:  # downstream tasks of every finished run (also runs finished by an earlier call)
        for spec in specs:
            if not (run_dir(cfg, spec, seed) / "result.json").exists():
                continue
            for task in cfg.finetune or {}:
                if finetune_run(cfg, spec, seed, task) is None:
                    pending.append(f"{spec.name}/seed-{seed}/finetune-{task}")
    out = Path(cfg.out)
    table = build_table(cfg, specs)
    atomic_write_text(out / "results.json", json.dumps(table, indent=2) + "\n")
    atomic_write_text(out / "results.md", table_markdown(table))
    figures = plot_table(table, out / "figures")
    for key in ("loss", "mlm_loss", "lm_loss"):
        p = plot_curves(cfg, specs, key, out / "figures" / f"curve-{key}.png")
        if p is not None:
            figures.append(p)
    return {"trained": trained, "skipped": skipped, "pending": pending, "figures": [str(p) for p in figures]}


def _run(kind: str):
    def run(cfg: ExperimentConfig) -> dict[str, Any]:
        summary = run_experiment(cfg)
        print(
            f"{kind}: trained {len(summary['trained'])}, skipped {len(summary['skipped'])} finished, "
            f"{len(summary['pending'])} pending"
        )
        print((Path(cfg.out) / "results.md").read_text())
        if summary["pending"]:
            print("run the same command again to finish: " + ", ".join(summary["pending"]))
        return summary

    run.__name__ = kind
    return run


def experiment_commands() -> dict:
    """``debertakit experiment ablation|nlg --config FILE.yaml`` (the file holds `ExperimentConfig` fields at its
    top level; any field can be overridden on the command line, e.g. ``--seeds [0]``)."""
    from debertakit.train.commands import _flat_command

    return {
        "ablation": _flat_command(
            ExperimentConfig,
            _run("ablation"),
            "Train every ablation variant (DeBERTa Table 4) with several seeds on the same shards and budget; "
            "tabulate held-out metrics with significance tests against the reference. Run again to resume.",
        ),
        "nlg": _flat_command(
            ExperimentConfig,
            _run("nlg"),
            "Causal LM, DeBERTa-MT and a RoBERTa-style causal LM (DeBERTa Table 10) with several seeds: held-out "
            "next-token perplexity with significance tests. Run again to resume.",
        ),
    }
