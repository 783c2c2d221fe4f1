"""Side-by-side CPU benchmark: Hugging Face transformers and debertakit on the same weights.

    python benchmarks/attention_cpu.py                 # all cases, writes benchmarks/results/attention_cpu.{json,md}
    python benchmarks/attention_cpu.py --cases fwd-8x128 fwd-2x512 --no-write

A random DeBERTa-v3-base-shaped model (hidden 768, 12 heads, FFN 3072, 256 buckets, max relative distance 512,
shared attention keys, LayerNorm on the relative table, vocabulary 128100) is built with transformers,
saved with ``save_pretrained`` and loaded with ``debertakit.load_pretrained`` (default backend "auto").

Each case runs in fresh subprocesses, 2 threads, fp32:

* **speed**: one process loads both models and alternates them (HF, ours, HF, ours, ...) after one warm-up
  pass each; tokens/s from the median time. Forward cases run in eval mode under ``torch.no_grad``; the
  training step is forward + backward of ``last_hidden_state.square().mean()`` in train mode (dropout 0.1 as in
  the released config).
* **memory**: one process per implementation loads its model, runs a 64-token pass and reads every weight (so
  that one-time costs count for neither: lazy library initialisation, and transformers' weights, which stay in
  the mapped checkpoint file until a pass first reads them), resets the kernel's resident-set high-water mark
  (``/proc/self/clear_refs``), runs one pass and reports the high-water mark (``VmHWM``: libraries, resident
  weights and everything the pass needed), and that peak minus the resident size just before the pass (the
  memory the pass itself needed).

Hugging Face is skipped where it cannot fit: at (1, 32768) its N×N fp32 scores and int64 indices need far more
than the 24 GB of the reference machine (about 18.7 GB already at 8192).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THREADS = 2
ROOT = Path(__file__).resolve().parents[1]

# name -> (batch, length, layers, mode, timed repetitions per implementation, run Hugging Face)
CASES = {
    "fwd-8x128": (8, 128, 12, "forward", 9, True),
    "fwd-2x512": (2, 512, 12, "forward", 9, True),
    "fwd-1x2048": (1, 2048, 12, "forward", 3, True),
    "fwd-1x8192": (1, 8192, 2, "forward", 1, True),
    "fwd-1x32768": (1, 32768, 2, "forward", 1, False),
    "train-4x512": (4, 512, 4, "train", 5, True),
}

# the targets: minimum speed ratio (ours / HF), and memory limits
TARGETS = {
    "fwd-8x128": {"speedup": 1.2},
    "fwd-2x512": {"speedup": 1.4},
    "fwd-1x2048": {"speedup": 3.0, "memory_fraction": 1 / 3},
    "fwd-1x8192": {"speedup": 6.0, "peak_rss_gb": 2.0},
    "fwd-1x32768": {"peak_rss_gb": 6.0},
    "train-4x512": {"speedup": 1.3},
}


def v3_base_config(layers: int):
    import transformers

    return transformers.DebertaV2Config(
        vocab_size=128100,
        hidden_size=768,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        type_vocab_size=0,
        relative_attention=True,
        position_buckets=256,
        max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"],
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        layer_norm_eps=1e-7,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )


def build_checkpoint(layers: int, out: Path) -> Path:
    import torch
    import transformers

    path = out / f"v3-base-{layers}-layers"
    if not path.exists():
        torch.manual_seed(0)
        transformers.DebertaV2Model(v3_base_config(layers)).save_pretrained(path)
    return path


# ---- worker side ------------------------------------------------------------------------------------------


def _rss_now_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (VmHWM) so that loading does not count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _load(impl: str, path: str, mode: str):
    import transformers

    import debertakit

    if impl == "hf":
        model = transformers.DebertaV2Model.from_pretrained(path)
    else:
        model = debertakit.load_pretrained(path, "base")
    model.train(mode == "train")
    if mode == "train":
        return model
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _step(model, ids, mask, mode: str) -> None:
    import torch

    if mode == "forward":
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    else:
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        out.square().mean().backward()


def worker(args) -> dict:
    import torch

    torch.set_num_threads(THREADS)
    batch, length, _, mode, reps, _ = CASES[args.case]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 128000, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    impls = args.impls.split(",")
    models = {impl: _load(impl, args.model, mode) for impl in impls}
    if args.memory:
        # one-time costs out of the measured pass, for both alike: a short pass (lazy initialisation of the
        # libraries and kernels) and every weight paged in (transformers maps the checkpoint file and reads a
        # weight only when a pass first uses it; debertakit reads it while loading)
        for impl in impls:
            _step(models[impl], ids[:, :64], mask[:, :64], mode)
            for p in models[impl].parameters():
                float(p.detach().sum())
            models[impl].zero_grad(set_to_none=True)
    gc.collect()
    rss_loaded = _rss_now_bytes()  # after loading (and, for memory runs, the warm-up)
    reset = _reset_peak_rss()
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    if args.warmup:
        for impl in impls:
            _step(models[impl], ids, mask, mode)
    for _ in range(reps if args.warmup else 1):
        for impl in impls:  # alternate
            t0 = time.perf_counter()
            _step(models[impl], ids, mask, mode)
            times[impl].append(time.perf_counter() - t0)
    return {
        "times": times,
        "peak_rss_bytes": _peak_rss_bytes(),
        "rss_before_pass_bytes": rss_loaded,
        "peak_reset_after_load": reset,
    }


def run_worker(case: str, impls: list[str], model: Path, warmup: bool, memory: bool = False) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--case",
        case,
        "--impls",
        ",".join(impls),
        "--model",
        str(model),
    ]
    if warmup:
        cmd.append("--warmup")
    if memory:
        cmd.append("--memory")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "MKL_NUM_THREADS": str(THREADS),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} {impls} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- driver side ------------------------------------------------------------------------------------------


def run_case(case: str, model: Path) -> dict:
    batch, length, layers, mode, reps, with_hf = CASES[case]
    impls = ["hf", "ours"] if with_hf else ["ours"]
    heavy = batch * length >= 8192
    t0 = time.perf_counter()
    # speed: both models in one process, alternating (one untimed warm-up each, except for the heavy cases
    # where one pass takes a minute for Hugging Face: a single timed pass each)
    speed = run_worker(case, impls, model, warmup=not heavy)
    row = {"case": case, "batch": batch, "length": length, "layers": layers, "mode": mode}
    tokens = batch * length
    for impl in impls:
        t = statistics.median(speed["times"][impl])
        row[f"{impl}_seconds"] = t
        row[f"{impl}_tokens_per_s"] = tokens / t
        # memory: a fresh process per implementation, one pass
        mem = run_worker(case, [impl], model, warmup=False, memory=True)
        row[f"{impl}_peak_rss_gb"] = mem["peak_rss_bytes"] / 1e9
        row[f"{impl}_pass_peak_gb"] = (mem["peak_rss_bytes"] - mem["rss_before_pass_bytes"]) / 1e9
    if with_hf:
        row["speedup"] = row["ours_tokens_per_s"] / row["hf_tokens_per_s"]
        row["memory_fraction"] = row["ours_peak_rss_gb"] / row["hf_peak_rss_gb"]
        row["pass_memory_fraction"] = row["ours_pass_peak_gb"] / max(row["hf_pass_peak_gb"], 1e-9)
    row["verdict"] = verdict(case, row)
    row["wall_seconds"] = time.perf_counter() - t0
    return row


def verdict(case: str, row: dict) -> str:
    notes = []
    for key, want in TARGETS.get(case, {}).items():
        if key == "speedup" and "speedup" in row:
            got = row["speedup"]
            ok = got >= want
            notes.append(
                f"speed {got:.2f}x (target >= {want}x){'' if ok else f': MISSED by {want - got:.2f}x'}"
            )
        elif key == "memory_fraction" and "memory_fraction" in row:
            tot, pas = row["memory_fraction"], row["pass_memory_fraction"]
            ok = tot <= want
            notes.append(
                f"peak RSS {tot:.2f} of HF's, pass-only {pas:.2f} (target <= {want:.2f})"
                + ("" if ok else ": MISSED on whole-process peak RSS")
            )
        elif key == "peak_rss_gb":
            got = row["ours_peak_rss_gb"]
            ok = got <= want
            notes.append(f"peak RSS {got:.2f} GB (target <= {want} GB){'' if ok else ': MISSED'}")
    return "; ".join(notes)


def machine() -> dict:
    import torch
    import transformers

    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return {
        "cpu": cpu,
        "cores_visible": os.cpu_count(),
        "threads_used": THREADS,
        "memory_gb": round(mem_gb, 1),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
    }


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        "# CPU benchmark: debertakit vs Hugging Face transformers",
        "",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        f"- machine: {m['cpu']} ({m['cpu_capability']}), {m['cores_visible']} cores visible, {m['threads_used']} "
        f"threads used, {m['memory_gb']} GB RAM",
        f"- versions: Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}",
        "- model: DeBERTa-v3-base shape (hidden 768, 12 heads, FFN 3072, 256 buckets, max distance 512, "
        "vocabulary 128100), random weights saved by transformers and loaded by debertakit; fp32",
        "- speed: both models in one process, alternating, median of the timed passes; memory: a fresh process per "
        "implementation loads the model, runs a 64-token pass and reads every weight, resets the resident-set "
        "high-water mark, runs one pass and reports it (whole process incl. libraries and weights, and in brackets "
        "minus the RSS just before the pass = the pass itself)",
        "",
        "| case | layers | HF tok/s | ours tok/s | speed-up | HF peak RSS GB (pass) | ours peak RSS GB (pass) "
        "| targets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        hf_t = f"{r['hf_tokens_per_s']:.0f}" if "hf_tokens_per_s" in r else "skipped"
        hf_m = f"{r['hf_peak_rss_gb']:.2f} ({r['hf_pass_peak_gb']:.2f})" if "hf_peak_rss_gb" in r else "—"
        sp = f"{r['speedup']:.2f}x" if "speedup" in r else "—"
        lines.append(
            f"| {r['mode']} ({r['batch']}, {r['length']}) | {r['layers']} | {hf_t} | {r['ours_tokens_per_s']:.0f} "
            f"| {sp} | {hf_m} | {r['ours_peak_rss_gb']:.2f} ({r['ours_pass_peak_gb']:.2f}) | {r['verdict']} |"
        )
    if result.get("run_commit"):
        lines.insert(3, f"- code: commit {result['run_commit']}")
    if result.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        )
        return out.stdout.strip()
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--impls", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--warmup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    command = "python benchmarks/attention_cpu.py" + (
        "" if args.cases == list(CASES) else " --cases " + " ".join(args.cases)
    )
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine(),
        "run_commit": _commit(),
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for case in args.cases:
            layers = CASES[case][2]
            if layers not in models:
                models[layers] = build_checkpoint(layers, Path(tmp))
            row = run_case(case, models[layers])
            result["rows"].append(row)
            hf = f"{row['hf_tokens_per_s']:9.0f}" if "hf_tokens_per_s" in row else "  skipped"
            print(
                f"{case:12s} HF {hf} tok/s  ours {row['ours_tokens_per_s']:9.0f} tok/s  "
                f"peak RSS HF {row.get('hf_peak_rss_gb', float('nan')):6.2f} GB ours {row['ours_peak_rss_gb']:6.2f} GB"
                f"  | {row['verdict']}",
                flush=True,
            )
    if not args.no_write:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "attention_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "attention_cpu.md").write_text(markdown(result))
        print(f"wrote {out / 'attention_cpu.json'} and {out / 'attention_cpu.md'}")


if __name__ == "__main__":
    main()
