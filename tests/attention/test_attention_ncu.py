"""`benchmarks/attention_ncu.py` without a GPU: ncu's pages parsed and summarised, the child's profiled call on the
CPU, and the whole run against a stand-in for ncu that prints pages of the format the real one writes."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

RAW = textwrap.dedent(
    """\
    ==PROF== Connected to process 4242
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","launch__registers_per_thread","sm__warps_active.avg.pct_of_peak_sustained_active","l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum","l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_not_issued_per_issue_active.ratio","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    "","","","","","","","","","","","nsecond","register/thread","%","","sector","ratio","ratio","ratio","%","%"
    "0","4242","python3","gpu","_fwd_kernel","1","7","(128, 1, 1)","(3072, 1, 1)","0","9.0","1,612,345","168","24.5","2,048","16,384","12.25","3.5","1.0","41.5","2.0"
    "1","4242","python3","gpu","_dq_kernel","1","7","(128, 1, 1)","(3072, 1, 1)","0","9.0","2,700,000","255","12.0","4,096","65,536","4.0","9.0","0.5","n/a","1.0"
    """
)

SOURCE = textwrap.dedent(
    """\
    "Kernel Name","_fwd_kernel"
    "Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
    "0x7f0000000000","MOV R1, c[0x0][0x28] ;","1","1"
    "0x7f0000000010","LDGSTS.E.LTC128B [R2], desc[UR4][R4.64] ;","30","28"
    "0x7f0000000020","HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], RZ ;","10","5"
    "0x7f0000000030","@!P0 BRA 0x7f0000000010 ;","4","4"
    "0x7f0000000040","EXIT ;","0","0"
    "Kernel Name","_dq_kernel"
    "Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
    "0x7f0000001000","LDG.E R2, desc[UR4][R4.64] ;","3","3"
    "0x7f0000001010","EXIT ;","1","1"
    """
)


def _module():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports attention_gpu beside it
    spec = importlib.util.spec_from_file_location("attention_ncu", ROOT / "benchmarks" / "attention_ncu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_raw_page_gives_each_kernel_its_metrics_with_the_duration_in_microseconds():
    kernels = _module().parse_raw(RAW)
    assert [k["Kernel Name"] for k in kernels] == ["_fwd_kernel", "_dq_kernel"]
    assert kernels[0]["gpu__time_duration.sum"] == pytest.approx(
        1612.345
    )  # nanoseconds, thousands separators
    assert kernels[1]["launch__registers_per_thread"] == 255.0
    assert kernels[1]["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"] == "n/a"
    assert _module().parse_raw("==ERROR== no kernels were profiled\n") == []


def test_summary_orders_the_stalls_and_takes_the_busiest_tensor_pipe():
    ncu = _module()
    fwd, dq = (ncu.summarize_metrics(k) for k in ncu.parse_raw(RAW))
    assert list(fwd["stalls"].items()) == [
        ("long_scoreboard", 12.25),
        ("barrier", 3.5),
    ]  # not_issued left out
    assert list(dq["stalls"]) == ["barrier", "long_scoreboard"]
    assert fwd["tensor_pipe_pct"] == 41.5 and dq["tensor_pipe_pct"] == 1.0  # "n/a" is no number
    assert fwd["ldgsts_sectors"] / fwd["ldgsts_requests"] == 8.0
    assert fwd["ld_requests"] is None  # not collected: None, not an error


def test_summary_shows_what_a_writing_kernel_is_held_by():
    """For a kernel that mostly writes (the distance tables' product): the global stores' sectors per request,
    the DRAM bytes written and their rate over the kernel's duration, and the memory's and L2's share of their
    peak, in the summary and in the Markdown table; a summary without them (an older results file) prints
    dashes."""
    ncu = _module()
    raw = textwrap.dedent(
        """\
        "ID","Kernel Name","gpu__time_duration.sum","dram__bytes_write.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","lts__throughput.avg.pct_of_peak_sustained_elapsed","l1tex__t_requests_pipe_lsu_mem_global_op_st.sum","l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
        "","","us","Mbyte","%","%","",""
        "0","_distance_product_kernel","253.5","453.4","37.2","45.6","1,000","17,000"
        """
    )
    (k,) = ncu.summarize(ncu.parse_raw(raw), [])
    assert k["dram_write_bytes"] == pytest.approx(453.4e6)
    assert (k["dram_pct"], k["l2_pct"]) == (37.2, 45.6)
    assert k["st_sectors"] / k["st_requests"] == 17.0
    md = ncu.table([{"impl": "triton", "n": 2048, "kernels": [k]}])
    row = next(line for line in md.splitlines() if "_distance_product_kernel" in line)
    assert "| 17.0 | 453 MB (1.79 TB/s) | 37.2 / 45.6 |" in row
    assert row.count("|") == md.splitlines()[0].count("|")  # a cell per column
    old = {key: v for key, v in k.items() if key not in ("dram_pct", "l2_pct", "st_requests", "st_sectors")}
    assert "| — | 453 MB (1.79 TB/s) | — / — |" in ncu.table(
        [{"impl": "triton", "n": 2048, "kernels": [old]}]
    )


def test_summary_shows_what_a_streaming_kernel_reads_from_l2():
    """For kernels whose programs each stream the other side's blocks through L2 (dQ, dK/dV): the bytes L1 read
    from L2 (sectors of 32 bytes) and their rate over the kernel's duration, in its own column; dashes where ncu
    did not collect it; an error row keeps a cell per column."""
    ncu = _module()
    raw = textwrap.dedent(
        """        "ID","Kernel Name","gpu__time_duration.sum","lts__t_sectors_srcunit_tex_op_read.sum"
        "","","msecond","sector"
        "0","_dkv_kernel","5.36","403,125,000"
        """
    )
    (k,) = ncu.summarize(ncu.parse_raw(raw), [])
    assert k["us"] == pytest.approx(5360.0) and k["l2_read_sectors"] == 403_125_000
    md = ncu.table(
        [{"impl": "triton", "n": 8192, "kernels": [k]}, {"impl": "triton", "n": 512, "error": "x"}]
    )
    header, _, row, error = md.splitlines()[:4]
    assert "| L2 read |" in header and "| 12900 MB (2.41 TB/s) |" in row
    assert row.count("|") == error.count("|") == header.count("|")
    assert "| 12900 MB" not in ncu.table(
        [{"impl": "triton", "n": 8192, "kernels": [dict(k, l2_read_sectors=None)]}]
    )


def test_source_page_sums_the_stall_samples_per_opcode_and_per_loop_over_tiles():
    ncu = _module()
    fwd, dq = ncu.parse_source(SOURCE)
    assert fwd["kernel"] == "_fwd_kernel" and len(fwd["instructions"]) == 5
    summary = ncu.summarize_source(fwd["instructions"])
    assert summary["samples"] == 45.0
    assert summary["per_opcode"] == {"LDGSTS": round(30 / 45, 4), "HGMMA": round(10 / 45, 4),
                                     "BRA": round(4 / 45, 4), "MOV": round(1 / 45, 4)}  # fmt: skip
    # the backward branch closes a loop holding a tensor-core product: its three instructions hold 44 samples
    assert summary["loops"] == [{"instructions": 3, "samples_share": round(44 / 45, 4)}]
    assert summary["top"][0] == {"address": "0x7f0000000010", "sass": "LDGSTS.E.LTC128B [R2], desc[UR4][R4.64] ;",
                                 "share": round(30 / 45, 4)}  # fmt: skip
    assert ncu.summarize_source(dq["instructions"])["loops"] == []  # no loop over tiles: none reported
    # each kernel of the raw page takes the source block of its own name
    paired = ncu.summarize(ncu.parse_raw(RAW), [dq, fwd])
    assert [k["source"]["samples"] for k in paired] == [45.0, 4.0]
    assert "source" not in ncu.summarize(ncu.parse_raw(RAW), [dq])[0]


def test_ncu_is_found_where_given_on_path_or_in_the_install_folders(tmp_path, monkeypatch):
    ncu = _module()
    fake = tmp_path / "nsight-compute" / "2025.3.1" / "ncu"
    fake.parent.mkdir(parents=True)
    fake.write_text("")
    assert ncu.find_ncu(str(fake)) == str(fake)
    assert ncu.find_ncu(str(tmp_path / "missing")) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(ncu, "NCU_GLOBS", (str(tmp_path / "nsight-compute" / "*" / "ncu"),))
    assert ncu.find_ncu(None) == str(fake)
    monkeypatch.setattr(ncu, "NCU_GLOBS", ())
    assert ncu.find_ncu(None) is None


def test_profile_command_runs_the_child_on_the_profiled_region_only():
    ncu = _module()
    args = ncu.parse_args(["--tokens", "64", "--heads", "2", "--head-dim", "16"])
    command = ncu.profile_command("ncu", Path("r.ncu-rep"), args, "triton distance", 32)
    assert command[command.index("--profile-from-start") + 1] == "off"
    assert command[command.index("--kernel-name") + 1] == f"regex:{ncu.DEFAULT_KERNELS}"
    assert command[command.index("--export") + 1] == "r.ncu-rep"
    child = ncu.parse_args(command[command.index("--child") :])  # what the child process parses
    assert (child.child, child.n, child.tokens, child.heads, child.head_dim) == (
        "triton distance",
        32,
        64,
        2,
        16,
    )
    assert child.child_tiles is None
    command = ncu.profile_command("ncu", Path("r.ncu-rep"), args, "triton", 32, "128x64w8s2")
    assert ncu.parse_args(command[command.index("--child") :]).child_tiles == "128x64w8s2"


def test_child_runs_the_rows_forward_and_backward_once_profiled(monkeypatch, capsys):
    from debertakit.attention import triton_backend
    from debertakit.attention.triton_aot import Tiles

    ncu = _module()
    calls = []
    profiled = ncu.profiled_call

    def counting(fn, device):
        calls.append((fn.__name__, dict(triton_backend.TILE_OVERRIDES)))
        return profiled(fn, device)

    monkeypatch.setattr(ncu, "profiled_call", counting)
    args = ["--n", "16", "--tokens", "32", "--heads", "2", "--head-dim", "16", "--smoke"]
    assert ncu.main(["--child", "triton", *args]) == 0
    assert calls == [("fwd_only", {}), ("fwd_bwd", {})]  # only the second runs: see profiled_call
    assert "fwd_error=not profiled" in capsys.readouterr().out
    calls.clear()
    assert ncu.main(["--child", "triton", *args, "--child-tiles", "16x16w4s1"]) == 0
    assert calls[1] == ("fwd_bwd", dict.fromkeys(triton_backend.KERNEL_NAMES, Tiles(16, 16, 4, 1)))
    assert triton_backend.TILE_OVERRIDES == {}  # restored after the call
    assert ncu.main(["--child", "no such row", *args]) == 4
    assert "cannot run here" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_profile_refuses_to_run_without_cuda(tmp_path, capsys):
    out = tmp_path / "ncu.json"
    assert _module().main(["--out", str(out)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not out.exists()


def _fake_ncu(tmp_path: Path) -> Path:
    """A stand-in for ncu: a profile writes the report (or fails, for the flashdeberta row, as ncu does without
    access to the counters), an import prints the page asked for (not the source page of the distance row's
    report, as an ncu without ``--print-source`` would not)."""
    (tmp_path / "raw.csv").write_text(RAW)
    (tmp_path / "source.csv").write_text(SOURCE)
    script = tmp_path / "ncu"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""\
            import pathlib, sys
            a = sys.argv[1:]
            if a == ["--version"]:
                print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0")
            elif "--export" in a:
                if a[a.index("--child") + 1] == "flashdeberta":
                    sys.exit("==ERROR== ERR_NVGPUCTRPERM - no permission to access the GPU performance counters")
                pathlib.Path(a[a.index("--export") + 1]).write_text("report")
            elif "--import" in a:
                page = a[a.index("--page") + 1]
                if page == "source" and "distance" in a[a.index("--import") + 1]:
                    sys.exit("==ERROR== unrecognised option '--print-source'")
                print(pathlib.Path({str(tmp_path)!r}, page + ".csv").read_text())
            """
        )
    )
    script.chmod(0o755)
    return script


def test_run_profiles_each_row_and_length_and_records_what_fails(tmp_path, monkeypatch):
    ncu = _module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ncu, "environment", lambda path: {"device": "test", "ncu": path})
    out, raw = tmp_path / "ncu.json", tmp_path / "pages"
    common = ["--ncu", str(_fake_ncu(tmp_path)), "--raw-dir", str(raw), "--out", str(out)]
    impls = ["--impls", "triton", "flashdeberta", "triton distance"]
    assert ncu.main([*common, *impls, "--lengths", "512"]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and result["pending"] == []
    triton, fd, dist = result["rows"]
    assert [k["kernel"] for k in triton["kernels"]] == ["_fwd_kernel", "_dq_kernel"]
    assert triton["kernels"][0]["us"] == pytest.approx(1612.345)
    assert triton["kernels"][0]["source"]["loops"][0]["samples_share"] == round(44 / 45, 4)
    assert "ERR_NVGPUCTRPERM" in fd["error"] and "kernels" not in fd
    # no source page: the raw page's summary all the same, the source page's error beside it
    assert dist["kernels"][0]["us"] == pytest.approx(1612.345) and "source" not in dist["kernels"][0]
    assert "--print-source" in dist["source_error"]
    assert sorted(p.name for p in raw.glob("*.csv")) == [
        "triton-distance-n512.raw.csv",
        "triton-n512.raw.csv",
        "triton-n512.source.csv",
    ]
    assert "ERR_NVGPUCTRPERM" in (raw / "flashdeberta-n512.log").read_text()  # ncu's own output, kept
    md = out.with_suffix(".md").read_text()
    assert "`python benchmarks/attention_ncu.py --ncu " in md  # the command that made it
    assert "| triton | 512 | _fwd_kernel | 1612.3 | 168 |" in md and "long_scoreboard 12.2" in md
    assert "| flashdeberta | 512 | error: ncu exit 1" in md

    # a budget spent before the first profile: nothing measured, everything pending
    tiles = ["--tiles", "64x32w4s2", "128x64w8s2"]
    assert ncu.main([*common, "--impls", "triton", "--lengths", "512", *tiles, "--budget-s", "0"]) == 3
    result = json.loads(out.read_text())
    assert result["rows"] == [] and result["pending"] == ["triton 64x32w4s2 N=512", "triton 128x64w8s2 N=512"]


def _with_units(raw: str, time_unit: str, byte_unit: str) -> str:
    """``RAW`` with its duration in ``time_unit`` and two DRAM byte columns in ``byte_unit``."""
    lines = raw.splitlines()
    lines[1] += ',"dram__bytes_read.sum","dram__bytes_write.sum"'
    lines[2] = lines[2].replace('"nsecond"', f'"{time_unit}"') + f',"{byte_unit}","{byte_unit}"'
    lines[3] = lines[3].replace('"1,612,345"', '"1.612345"') + ',"636.7","24.5"'
    lines[4] = lines[4].replace('"2,700,000"', '"2.7"') + ',"775.0","518.1"'
    return "\n".join(lines) + "\n"


def test_raw_page_units_as_a_newer_ncu_spells_them():
    # Nsight Compute 2025.3 writes "ms" / "us" for durations and "Mbyte" for the DRAM bytes: read as
    # "msecond" they were taken for microseconds, and the bytes for bytes (1.7 µs and 0 MB in the summary)
    ncu = _module()
    fwd, dq = ncu.parse_raw(_with_units(RAW, "ms", "Mbyte"))
    assert fwd["gpu__time_duration.sum"] == pytest.approx(1612.345)  # microseconds
    assert dq["gpu__time_duration.sum"] == pytest.approx(2700.0)
    assert fwd["dram__bytes_read.sum"] == pytest.approx(636.7e6)
    assert dq["dram__bytes_write.sum"] == pytest.approx(518.1e6)
    fwd, _ = ncu.parse_raw(_with_units(RAW, "us", "Gbyte"))
    assert fwd["gpu__time_duration.sum"] == pytest.approx(1.612345)
    assert fwd["dram__bytes_read.sum"] == pytest.approx(636.7e9)
    with pytest.raises(ValueError, match="'fortnight'"):
        ncu.parse_raw(_with_units(RAW, "fortnight", "byte"))


def test_results_are_summarised_again_from_the_kept_pages(tmp_path):
    ncu = _module()
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "triton-n512.raw.csv").write_text(_with_units(RAW, "ms", "Mbyte"))
    (pages / "triton-n512.source.csv").write_text(SOURCE)
    stale = {**ncu.summarize(ncu.parse_raw(RAW), [])[0], "us": 1.612345}  # what the old parser made of "ms"
    rows = [
        {"impl": "triton", "n": 512, "tiles": None, "batch": 32, "seconds": 9.0, "kernels": [stale]},
        {"impl": "flashdeberta", "n": 512, "tiles": None, "batch": 32, "error": "ncu exit 1"},
        {"impl": "triton distance", "n": 512, "tiles": None, "batch": 32, "kernels": [stale]},  # no pages
    ]
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps({"environment": {"device": "test"}, "complete": True, "pending": [], "rows": rows})
    )
    out = tmp_path / "new.json"
    assert ncu.main(["--resummarize", str(old), "--raw-dir", str(pages), "--out", str(out)]) == 0
    triton, fd, dist = json.loads(out.read_text())["rows"]
    assert triton["seconds"] == 9.0 and triton["batch"] == 32
    assert [k["us"] for k in triton["kernels"]] == pytest.approx([1612.345, 2700.0])
    assert triton["kernels"][0]["dram_read_bytes"] == pytest.approx(636.7e6)
    assert triton["kernels"][0]["source"]["loops"][0]["samples_share"] == round(44 / 45, 4)
    assert fd == rows[1] and dist == rows[2]  # failed, or without pages: as they were
    assert "| triton | 512 | _fwd_kernel | 1612.3 |" in out.with_suffix(".md").read_text()
    assert ncu.main(["--resummarize", str(old), "--out", str(out)]) == 2  # no --raw-dir
