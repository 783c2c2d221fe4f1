"""Nsight Compute profile of the attention kernels on a GPU: where their time goes, not only how much.

`attention_gpu.py` times each row of its ``attention`` section; this script says why a row runs at the speed it
does. For each row named by ``--impls`` (default: ``triton``, ``triton tables``, ``triton (no position
terms)``, ``flashdeberta`` and ``sdpa (no position terms)``, built as that section builds them) and each length of
``--lengths`` (default 512, where every tile of the v3 input is near, and 8192, where most are far), a child
process of this script runs the row's forward+backward once under ``ncu --set full`` (only that call: the
region between ``cudaProfilerStart`` and ``cudaProfilerStop``, after a warm-up call that compiles), and the
report is read back through two of ncu's pages:

* ``raw``, per kernel: duration, achieved occupancy, issue slots busy, the tensor pipes' activity, the L1
  requests and sectors of global loads and of asynchronous copies (LDGSTS), shared-memory bank conflicts, DRAM
  bytes, registers per thread, and the warp states: cycles per issued instruction spent stalled for each reason
  (long scoreboard: waiting on a global load; barrier; wait: a fixed latency; math pipe throttle; ...);
* ``source`` (SASS), per instruction: its stall samples, summed per opcode and per loop over tiles (the loops
  of `triton_aot.mma_loops`: at distance i - j a kernel's far, near and far runs), and the instructions that
  hold the most.

So the near band's slowness (N = 512 on the H100: 13 to 16 TFLOP/s forward, sdpa 360) is split into
waiting on gathers, on the tensor cores, on the pipeline's barriers, or issuing too much. Kernels are selected
by name (``--kernels``, a regular expression over the function name; default: Triton's kernels, whose names
start with ``_``, and the flash / fused attention kernels of sdpa), so the host's matmuls and copies are
not replayed. Writes ``benchmarks/results/attention_ncu.json`` and ``.md`` (rewritten after each profile,
atomically), and each profile's two pages as CSV files under ``--raw-dir`` with ncu's output (kept for what
the summary does not show). A profile that fails (ncu cannot read the GPU's counters, a timeout) records ncu's
last lines as its error and the run goes on (without the source page, the raw page's summary stays);
``--budget-s`` starts no profile after that many seconds.

Usage::

    python benchmarks/attention_ncu.py                                   # 5 rows × 2 lengths
    python benchmarks/attention_ncu.py --impls triton --lengths 512 --raw-dir pages --out /tmp/ncu.json
    python benchmarks/attention_ncu.py --impls triton "triton (no position terms)" --lengths 8192 \
        --tiles 64x32w4s2 128x64w8s2                                      # each row at each tile shape
    python benchmarks/attention_ncu.py --ncu /opt/nvidia/nsight-compute/2025.3.1/ncu
    python benchmarks/attention_ncu.py --resummarize old.json --raw-dir pages --out new.json  # no GPU: pages again

Needs CUDA and Nsight Compute with access to the counters (root, or a driver that allows profiling); without
either it exits with a message and writes nothing.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "attention_ncu.json"
DEFAULT_IMPLS = [
    "triton",
    "triton tables",
    "triton (no position terms)",
    "flashdeberta",
    "sdpa (no position terms)",
]
# Triton's kernels (`_fwd_kernel`, flashdeberta's `_fwd_kernel_deberta_...`) and sdpa's fused ones
DEFAULT_KERNELS = r"^_|flash|fmha|sdpa|attention"
NCU_GLOBS = (
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/cuda*/bin/ncu",
    "/usr/local/cuda*/nsight-compute*/ncu",
)
TOP_INSTRUCTIONS = 8  # instructions listed per kernel, by stall samples
TOP_STALLS = 5  # stall reasons printed per kernel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--impls", nargs="+", default=DEFAULT_IMPLS, help="rows of attention_gpu.py's attention section"
    )
    p.add_argument("--lengths", nargs="+", type=int, default=[512, 8192])
    p.add_argument("--tokens", type=int, default=16384, help="batch·N of every shape")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument(
        "--tiles",
        nargs="+",
        default=None,
        help="tile shapes for all three triton kernels, e.g. 64x32w4s2 (each)",
    )
    p.add_argument("--kernels", default=DEFAULT_KERNELS, help="regular expression over the kernels' names")
    p.add_argument("--set", default="full", help="ncu's section set")
    p.add_argument(
        "--ncu", default=None, help="ncu's path (default: on PATH or in the usual install folders)"
    )
    p.add_argument(
        "--raw-dir", type=Path, default=None, help="where the CSV pages go (default: a temp folder)"
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--timeout-s", type=float, default=300.0, help="per profile")
    p.add_argument("--budget-s", type=float, default=None, help="start no profile after this many seconds")
    p.add_argument(
        "--resummarize",
        type=Path,
        default=None,
        metavar="JSON",
        help="summarise this results file again from the pages in --raw-dir (no GPU needed) into --out",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: the row to run under ncu
    p.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-tiles", default=None, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # the child on CPU (tests)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------- the child
def profiled_call(fn: Callable[[], object], device: str) -> dict:
    """The timer handed to `attention_gpu._attention_rows`: the forward+backward call (``fwd_bwd``) runs once to
    compile, then once between cudaProfilerStart / Stop, the region ncu profiles; the forward-only call is not
    run. The time returned is the profiled call's wall time (ncu replays each kernel: it means nothing)."""
    import torch

    if getattr(fn, "__name__", "") != "fwd_bwd":
        return {"error": "not profiled"}
    fn()
    start = time.perf_counter()
    if device == "cuda":
        torch.cuda.synchronize()
        with torch.cuda.profiler.profile():  # cudaProfilerStart ... cudaProfilerStop
            fn()
            torch.cuda.synchronize()
    else:  # the smoke run of the tests: no profiler
        fn()
    return {"ms": (time.perf_counter() - start) * 1e3, "peak_gib": None}


def run_child(args: argparse.Namespace) -> int:
    """Builds the row ``args.child`` at length ``args.n`` as `attention_gpu`'s attention section does and runs
    its forward+backward in the profiled region."""
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import attention_gpu
    import torch

    from debertakit.attention.triton_backend import KERNEL_NAMES

    device = "cpu" if args.smoke else "cuda"
    rows_of = attention_gpu._attention_rows
    if args.child_tiles is not None:  # the tiles of the `tiles` section's sweep, for all three kernels
        tiles = attention_gpu.parse_tiles(args.child_tiles)
        rows_of = attention_gpu._with_backend_settings(
            rows_of, TILE_OVERRIDES=dict.fromkeys(KERNEL_NAMES, tiles)
        )
    rows = rows_of(args, args.n, device, torch.bfloat16, only=(args.child,), timer=profiled_call)
    if not rows:
        print(f"row {args.child!r} cannot run here (unknown, or not available)", file=sys.stderr)
        return 4
    if "fwd_bwd_error" in rows[0]:
        print(f"row {args.child!r}: {rows[0]['fwd_bwd_error']}", file=sys.stderr)
        return 4
    return 0


# ---------------------------------------------------------------------------------------------- ncu's pages
def _number(text: str) -> float | str:
    """A cell of ncu's CSV as a number where it is one ("1,234.5" -> 1234.5), else the text."""
    cleaned = text.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return text


# What the units row's units are worth in the summary's units (durations in microseconds, sizes in bytes). ncu
# spells them either way, by version and by the value's size: Nsight Compute 2025.3 on an H200 wrote "ms" and
# "us" for durations and "Mbyte" for DRAM bytes, where older pages say "nsecond" and "byte".
_TIME_UNITS = {
    **{"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6},
    **{"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6},
}
_BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
# the metrics converted, and the units they are converted by (a unit not listed is an error, not a guess)
_SCALED = {
    "gpu__time_duration.sum": _TIME_UNITS,
    "dram__bytes_read.sum": _BYTE_UNITS,
    "dram__bytes_write.sum": _BYTE_UNITS,
}


def _scaled(name: str, value: float, unit: str) -> float:
    """``value`` of metric ``name`` in the summary's unit; a page without a units row (unit "") is taken as
    already in it."""
    units = _SCALED[name]
    if unit and unit not in units:
        raise ValueError(f"ncu gave {name} in {unit!r}; expected one of {sorted(units)}")
    return value * units.get(unit, 1.0)


def parse_raw(text: str) -> list[dict]:
    """``ncu --import R --page raw --csv``: one dict per profiled kernel, metric name -> value (numbers parsed;
    ``gpu__time_duration.sum`` converted to microseconds and the DRAM bytes to bytes, whatever unit the units
    row gives: `_SCALED`). The first row names the columns, the second gives their units; lines before the
    header (ncu's own messages) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(lines[start:]))
    header, kernels = rows[0], []
    has_units = len(rows) > 1 and rows[1] and rows[1][0] == ""  # a units row: no ID
    units = rows[1] if has_units else [""] * len(header)
    for row in rows[1 + has_units :]:
        if len(row) != len(header):
            continue
        metrics = {name: _number(cell) for name, cell in zip(header, row)}
        metrics["Kernel Name"] = row[header.index("Kernel Name")]
        for name in _SCALED.keys() & metrics.keys():
            if isinstance(metrics[name], float):
                metrics[name] = _scaled(name, metrics[name], units[header.index(name)])
        kernels.append(metrics)
    return kernels


_SASS = re.compile(r"^\s*(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*)$")
ALL_SAMPLES = "Warp Stall Sampling (All Samples)"


def parse_source(text: str) -> list[dict]:
    """``ncu --import R --page source --csv --print-source sass``: per profiled kernel, in order, its name and
    instructions as (address, opcode, operands, stall samples). Each kernel's block starts with a row whose
    first cell is "Kernel Name"; its table's header row starts with "Address"."""
    kernels: list[dict] = []
    header: list[str] | None = None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append({"kernel": row[1] if len(row) > 1 else "", "instructions": []})
            header = None
        elif row[0] == "Address" and kernels:
            header = row
        elif header is not None and len(row) == len(header):
            cells = dict(zip(header, row))
            found = _SASS.match(cells.get("Source", ""))
            if found is None:
                continue
            samples = _number(cells.get(ALL_SAMPLES, "0"))
            try:
                address = int(cells["Address"].removeprefix("0x"), 16)
            except ValueError:
                continue
            op, rest = found.group(1), found.group(2)
            kernels[-1]["instructions"].append(
                (address, op, rest, samples if isinstance(samples, float) else 0.0)
            )
    return kernels


# ------------------------------------------------------------------------------------------------- summary
# what the summary keeps of the raw page: name -> metric
KEPT = {
    "us": "gpu__time_duration.sum",
    "registers": "launch__registers_per_thread",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "ld_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "ld_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "ldgsts_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",
    "ldgsts_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
    "shared_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    # what a kernel that mostly writes (the distance tables' product) is held by: the memory's and L2's share of
    # their peak, and the sectors a global store touches per request (16-byte stores of a warp: 16 at best)
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "st_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "st_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    # what kernels that stream the other side's blocks through L2 (each program all of them) read from it: the
    # sectors of 32 bytes L1 asked L2 for
    "l2_read_sectors": "lts__t_sectors_srcunit_tex_op_read.sum",
}
# the warp states, cycles per issued instruction: smsp__average_warps_issue_stalled_<reason>_per_issue_active
_STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_TENSOR = re.compile(r"^sm__pipe_tensor\w*_cycles_active\.avg\.pct_of_peak_sustained_active$")


def summarize_metrics(metrics: dict) -> dict:
    """The kept metrics (None where this ncu did not collect one), the warp stall reasons largest first, and the
    busiest tensor pipe's activity."""
    out = {
        key: metrics.get(name) if isinstance(metrics.get(name), float) else None for key, name in KEPT.items()
    }
    stalls = {}
    tensor = []
    for name, value in metrics.items():
        if not isinstance(value, float):
            continue
        if found := _STALL.match(name):
            if not found.group(1).endswith("not_issued"):
                stalls[found.group(1)] = value
        elif _TENSOR.match(name):
            tensor.append(value)
    out["tensor_pipe_pct"] = max(tensor) if tensor else None
    out["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    return out


def summarize_source(instructions: list[tuple[int, str, str, float]]) -> dict:
    """Stall samples of one kernel: the share per opcode (its first word), per loop over tiles (in address
    order; `triton_aot.mma_loops`), and the instructions that hold the most."""
    from debertakit.attention.triton_aot import mma_loops

    samples = sum(s for *_, s in instructions)
    total = samples or 1.0
    per_op = Counter()
    for _, op, _, count in instructions:
        per_op[op.split(".")[0]] += count
    loops = mma_loops([(a, op, rest) for a, op, rest, _ in instructions])
    in_loops = []
    for first, last in loops:
        inside = [s for a, *_, s in instructions if first <= a <= last]
        in_loops.append({"instructions": len(inside), "samples_share": round(sum(inside) / total, 4)})
    top = sorted(instructions, key=lambda i: -i[3])[:TOP_INSTRUCTIONS]
    return {
        "samples": samples,
        "per_opcode": {op: round(s / total, 4) for op, s in per_op.most_common() if s > 0},
        "loops": in_loops,
        "top": [
            {"address": hex(a), "sass": f"{op}{rest}".strip(), "share": round(s / total, 4)}
            for a, op, rest, s in top
        ],
    }


def summarize(raw: list[dict], source: list[dict]) -> list[dict]:
    """One summary per profiled kernel of the raw page, with the source page's block of the same kernel (the
    pages list the profiled kernels in the same order: each takes the next block of its name)."""
    kernels, unused = [], list(source)
    for metrics in raw:
        entry = {"kernel": metrics["Kernel Name"], **summarize_metrics(metrics)}
        block = next((b for b in unused if b["kernel"] == entry["kernel"]), None)
        if block is not None:
            unused.remove(block)
            entry["source"] = summarize_source(block["instructions"])
        kernels.append(entry)
    return kernels


# ---------------------------------------------------------------------------------------------- the parent
def find_ncu(explicit: str | None) -> str | None:
    """ncu's path: ``explicit``, else on PATH, else the newest in the usual install folders; None if none."""
    if explicit is not None:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(path for pattern in NCU_GLOBS for path in glob.glob(pattern))
    return candidates[-1] if candidates else None


def _slug(impl: str, n: int, tiles: str | None) -> str:
    return re.sub(r"[^a-z0-9]+", "-", _name(impl, tiles).lower()).strip("-") + f"-n{n}"


def _name(impl: str, tiles: str | None) -> str:
    return impl if tiles is None else f"{impl} {tiles}"


def profile_command(
    ncu: str, report: Path, args: argparse.Namespace, impl: str, n: int, tiles: str | None = None
) -> list[str]:
    """The ncu command that profiles row ``impl`` at length ``n`` (at ``tiles``, else the backend's own) into
    ``report``: the child's profiled region only, the kernels named by ``--kernels``."""
    child = [sys.executable, str(Path(__file__).resolve()), "--child", impl, "--n", str(n)]
    child += ["--tokens", str(args.tokens), "--heads", str(args.heads), "--head-dim", str(args.head_dim)]
    child += [] if tiles is None else ["--child-tiles", tiles]
    return [
        ncu,
        "--profile-from-start", "off",
        "--set", args.set,
        "--kernel-name-base", "function",
        "--kernel-name", f"regex:{args.kernels}",
        "--import-source", "no",
        "--force-overwrite",
        "--export", str(report),
        *child,
    ]  # fmt: skip


def _run(command: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout, done.stderr


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def profile(ncu: str, args: argparse.Namespace, impl: str, n: int, tiles: str | None, raw_dir: Path) -> dict:
    """Profiles one row at one length (and tiles): ncu's output goes to ``raw_dir`` (``.log``), so do its pages
    (``.raw.csv``, ``.source.csv``), summarised. Without the raw page the profile is an error; without the
    source page (an ncu that cannot print it) the summary goes without stall samples per instruction."""
    slug = _slug(impl, n, tiles)
    report = raw_dir / f"{slug}.ncu-rep"
    began = time.monotonic()
    code, out, err = _run(profile_command(ncu, report, args, impl, n, tiles), args.timeout_s)
    (raw_dir / f"{slug}.log").write_text(out + err)
    entry = {"impl": impl, "n": n, "tiles": tiles, "batch": max(1, args.tokens // n)}
    entry["seconds"] = round(time.monotonic() - began, 1)
    if code != 0 or not report.is_file():
        return {**entry, "error": f"ncu exit {code}: {_tail(err + out)}"}
    pages = {}
    for page, extra in (("raw", []), ("source", ["--print-source", "sass"])):
        code, text, err = _run(
            # base units: ncu otherwise scales each value to its size ("ms", "Mbyte"; `_SCALED` reads both)
            [ncu, "--import", str(report), "--csv", "--print-units", "base", "--page", page, *extra],
            args.timeout_s,
        )
        if code != 0:
            entry[f"{page}_error"] = f"ncu --page {page} exit {code}: {_tail(err)}"
            continue
        (raw_dir / f"{slug}.{page}.csv").write_text(text)
        pages[page] = text
    if "raw" not in pages:
        return {**entry, "error": entry.pop("raw_error")}
    return _summarized(entry, pages, args.kernels)


def _summarized(entry: dict, pages: dict[str, str], kernels_regex: str) -> dict:
    """``entry`` with the summary of its profile's pages (the raw one, and the source one where there is one)."""
    kernels = summarize(parse_raw(pages["raw"]), parse_source(pages.get("source", "")))
    if not kernels:
        return {**entry, "error": f"no kernel matched --kernels {kernels_regex!r}"}
    return {**entry, "kernels": kernels}


def resummarize(results: dict, raw_dir: Path, kernels_regex: str) -> dict:
    """A results file summarised again from the pages its profiles kept in ``raw_dir`` (``<slug>.raw.csv``,
    ``.source.csv``): what a mended parser reads in them, without profiling again. Rows that failed, or whose raw
    page is missing, stay as they were."""
    rows = []
    for row in results["rows"]:
        slug = _slug(row["impl"], row["n"], row.get("tiles"))
        raw = raw_dir / f"{slug}.raw.csv"
        if "error" in row or not raw.is_file():
            rows.append(row)
            continue
        pages = {"raw": raw.read_text()}
        if (source := raw_dir / f"{slug}.source.csv").is_file():
            pages["source"] = source.read_text()
        entry = {k: v for k, v in row.items() if k != "kernels"}
        rows.append(_summarized(entry, pages, kernels_regex))
    return {**results, "rows": rows}


def _fmt_bytes(x: float | None) -> str:
    return "—" if x is None else f"{x / 1e6:.0f} MB"


def _rate(moved: float | None, us: float | None) -> str:
    """Bytes a kernel moved and their rate over its duration (ncu's clocks: lower than a timed run's)."""
    if moved is None or not us:
        return _fmt_bytes(moved)
    return f"{_fmt_bytes(moved)} ({moved / us / 1e6:.2f} TB/s)"


def _write_rate(k: dict) -> str:
    """A kernel's DRAM writes and their rate."""
    return _rate(k.get("dram_write_bytes"), k["us"])


def _l2_read_rate(k: dict) -> str:
    """What a kernel read from L2 (its sectors of 32 bytes) and the rate."""
    sectors = k.get("l2_read_sectors")
    return _rate(None if sectors is None else 32 * sectors, k["us"])


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def table(results: list[dict]) -> str:
    """Markdown: one line per kernel, then per kernel its top stall reasons, opcodes and loops."""
    lines = [
        "| impl | N | kernel | µs | regs | occupancy % | issue % | tensor % | LDGSTS sectors / request "
        "| LDG sectors / request | DRAM read | L2 read | STG sectors / request | DRAM write | DRAM / L2 % of peak "
        "| top stalls (cycles per issue) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for r in results:
        name = _name(r["impl"], r.get("tiles"))
        if "error" in r:
            lines.append(f"| {name} | {r['n']} | error: {r['error'][:160]} | | | | | | | | | | | | | |")
            continue
        for k in r["kernels"]:
            ratio = {
                # (.get: summaries written before a metric was kept lack it)
                kind: (k[f"{kind}_sectors"] / k[f"{kind}_requests"]) if k.get(f"{kind}_requests") else None
                for kind in ("ldgsts", "ld", "st")
            }
            stalls = ", ".join(f"{why} {v:.1f}" for why, v in list(k["stalls"].items())[:TOP_STALLS])
            lines.append(
                f"| {name} | {r['n']} | {k['kernel'][:40]} | {_fmt(k['us'])} | {_fmt(k['registers'], 0)} "
                f"| {_fmt(k['occupancy_pct'])} | {_fmt(k['issue_active_pct'])} | {_fmt(k['tensor_pipe_pct'])} "
                f"| {_fmt(ratio['ldgsts'])} | {_fmt(ratio['ld'])} | {_fmt_bytes(k['dram_read_bytes'])} "
                f"| {_l2_read_rate(k)} | {_fmt(ratio['st'])} | {_write_rate(k)} | {_fmt(k.get('dram_pct'))} / {_fmt(k.get('l2_pct'))} "
                f"| {stalls or '—'} |"
            )
            src = k.get("source")
            if src and src["samples"]:
                ops = ", ".join(f"{op} {share:.0%}" for op, share in list(src["per_opcode"].items())[:6])
                loops = " · ".join(
                    f"{loop['samples_share']:.0%} ({loop['instructions']})" for loop in src["loops"]
                )
                top = "; ".join(f"{t['share']:.0%} `{t['sass'][:60]}`" for t in src["top"][:3])
                details.append(
                    f"- {name}, N = {r['n']}, {k['kernel'][:40]}: stall samples by opcode {ops}; "
                    f"in the loops over tiles {loops or '(none found)'}; most: {top}"
                )
    return "\n".join(lines + ([""] + details if details else []))


def environment(ncu: str) -> dict:
    """The GPU benchmark's record of the machine and versions, and ncu's version."""
    import attention_gpu

    env = attention_gpu.environment("cuda")
    code, out, err = _run([ncu, "--version"], 60)
    env["ncu"] = out.strip().splitlines()[-1] if code == 0 and out.strip() else f"unknown ({_tail(err)})"
    return env


def write(out: Path, env: dict, results: list[dict], pending: list[str]) -> None:
    from debertakit.convert.checkpoint import atomic_write_text

    result = {"environment": env, "complete": not pending, "pending": pending, "rows": results}
    atomic_write_text(out, json.dumps(result, indent=1, default=str) + "\n")
    header = f"# Nsight Compute profile of the attention kernels\n\n`{env.get('command')}`\n\n"
    facts = ", ".join(f"{k} {env.get(k)}" for k in ("device", "torch", "triton", "cuda", "ncu", "date"))
    atomic_write_text(out.with_suffix(".md"), header + facts + "\n\n" + table(results) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return run_child(args)
    if args.resummarize is not None:
        if args.raw_dir is None:
            print("--resummarize needs --raw-dir, the folder of the profiles' pages", file=sys.stderr)
            return 2
        results = resummarize(json.loads(args.resummarize.read_text()), args.raw_dir, args.kernels)
        write(args.out, results["environment"], results["rows"], results["pending"])
        print(f"wrote {args.out} and {args.out.with_suffix('.md')} from the pages in {args.raw_dir}")
        return 0
    import attention_gpu
    import torch

    attention_gpu.check_impls(args.impls)
    if not torch.cuda.is_available():
        print(
            "attention_ncu.py needs a CUDA device; none is available here, nothing was written.",
            file=sys.stderr,
        )
        return 2
    ncu = find_ncu(args.ncu)
    if ncu is None:
        where = args.ncu or "PATH, " + ", ".join(NCU_GLOBS)
        print(f"attention_ncu.py needs Nsight Compute (ncu); none found in {where}.", file=sys.stderr)
        return 2
    raw_dir = args.raw_dir or Path(tempfile.mkdtemp(prefix="attention-ncu-"))
    raw_dir.mkdir(parents=True, exist_ok=True)
    env = environment(ncu)
    env["command"] = shlex.join(
        ["python", "benchmarks/attention_ncu.py", *(sys.argv[1:] if argv is None else argv)]
    )
    plan = [(impl, n, tiles) for tiles in args.tiles or [None] for n in args.lengths for impl in args.impls]
    results: list[dict] = []

    def pending() -> list[str]:
        return [f"{_name(impl, t)} N={n}" for impl, n, t in plan[len(results) :]]

    write(args.out, env, results, pending())  # --out writable before any profile
    began = time.monotonic()
    for impl, n, tiles in plan:
        if args.budget_s is not None and time.monotonic() - began >= args.budget_s:
            print(f"time budget of {args.budget_s} s reached: starting no more profiles", file=sys.stderr)
            break
        print(f"== {_name(impl, tiles)} N={n} ({len(results) + 1}/{len(plan)})", flush=True)
        results.append(profile(ncu, args, impl, n, tiles, raw_dir))
        write(args.out, env, results, pending())
    print(table(results))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')}; the pages in {raw_dir}")
    return 3 if pending() else 0


if __name__ == "__main__":
    raise SystemExit(main())
