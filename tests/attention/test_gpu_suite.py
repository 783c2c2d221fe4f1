"""`benchmarks/gpu_suite.py` without a GPU: the budgeted run of a plan (steps stopped, failed, not started),
its summary and bundle, and the real plan's commands as the scripts they call parse them."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    # imported by name, as the scripts import each other (and a dataclass needs its module in sys.modules)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def suite():
    return _module("gpu_suite")


def _py(code: str):
    return lambda work, seconds, smoke: [sys.executable, "-c", code]


def _spawning(pid_file: Path) -> str:
    """A step's code that starts a grandchild ignoring SIGTERM (it writes its pid once it does), then sleeps:
    stopping only the step, or the group by SIGTERM alone, would leave the grandchild running."""
    grandchild = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    return f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(60)"


def _steps(suite, pid_file: Path):
    Step = suite.Step
    return [
        Step("ok", "succeeds", _py("print('measured')"), cap_s=30, min_s=0),
        Step(
            "broken", "fails", _py("import sys; print('boom: no such row'); sys.exit(2)"), cap_s=30, min_s=0
        ),
        Step("slow", "outlasts its cap", _py(_spawning(pid_file)), cap_s=8, min_s=0),
        Step("late", "needs more than is left", _py("print('never')"), cap_s=30, min_s=10_000),
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child of a finished parent is reaped by init; a zombie still answers kill(0)
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def _stopped(pid_file: Path) -> bool:
    """Whether the grandchild whose pid ``pid_file`` holds is gone (waiting a little for init to reap it)."""
    assert pid_file.exists(), "the grandchild never started: the test proves nothing"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(grandchild)


def test_run_plan_runs_steps_in_order_stops_a_whole_group_and_leaves_what_does_not_fit(suite, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    reports = []
    began = time.monotonic()
    records = suite.run_plan(
        _steps(suite, pid_file), tmp_path, budget_s=120, report=lambda r, ran: reports.append((len(r), ran))
    )
    assert time.monotonic() - began < 60  # the slow step's 60 s sleep was cut at its 8 s cap
    assert [r["step"] for r in records] == ["ok", "broken", "slow", "late"]
    assert [r["status"] for r in records] == ["ok", "failed", "stopped", "not started"]
    # the summary is rewritten after every step; the bundle only after a step that ran
    assert reports == [(1, True), (2, True), (3, True), (4, False)]
    ok, broken, slow, late = records
    assert ok["rc"] == 0 and "log_tail" not in ok
    assert "measured" in (tmp_path / ok["log"]).read_text()
    assert broken["rc"] == 2 and "boom: no such row" in broken["log_tail"]
    assert slow["seconds"] < 30 and "stopped after 8 s" in (tmp_path / slow["log"]).read_text()
    assert _stopped(pid_file), "the stopped step's own children must be stopped with it, SIGTERM or not"
    assert "needs 10000" in late["reason"] and "command" not in late


def test_an_interrupted_suite_stops_the_step_it_was_running(suite, tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) to the suite while it waits for a step: the step's group is stopped, not orphaned
    (it runs in a session of its own, out of the terminal's reach)."""
    pid_file = tmp_path / "grandchild.pid"
    real_wait = suite.subprocess.Popen.wait
    calls = []

    def interrupted_wait(self, timeout=None):
        calls.append(timeout)
        if len(calls) == 1:  # the suite's wait for the step: interrupted once the grandchild is up
            deadline = time.monotonic() + 20
            while not pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            raise KeyboardInterrupt
        return real_wait(self, timeout)

    monkeypatch.setattr(suite.subprocess.Popen, "wait", interrupted_wait)
    argv = [sys.executable, "-c", _spawning(pid_file)]
    with pytest.raises(KeyboardInterrupt):
        suite.run_step(argv, tmp_path / "step.log", timeout_s=60)
    assert _stopped(pid_file)


def test_exit_status_3_means_units_left_only_for_a_budgeted_script(suite, tmp_path):
    """The benchmark scripts exit 3 when their budget left units; pytest's 3 is an internal error."""
    Step = suite.Step
    steps = [
        Step("bench", "", _py("raise SystemExit(3)"), cap_s=30, min_s=0, budgeted=True),
        Step("tests", "", _py("print('INTERNALERROR'); raise SystemExit(3)"), cap_s=30, min_s=0),
    ]
    bench, tests = suite.run_plan(steps, tmp_path, budget_s=60)
    assert bench["status"] == "left units" and "log_tail" not in bench
    assert tests["status"] == "failed" and "INTERNALERROR" in tests["log_tail"]


def test_a_step_gets_the_budget_left_not_its_whole_cap(suite, tmp_path):
    seen = []

    def argv(work, seconds, smoke):
        seen.append(seconds)
        return [sys.executable, "-c", "import time; time.sleep(30)"]

    step = suite.Step("capped", "", argv, cap_s=300, min_s=0)
    records = suite.run_plan([step], tmp_path, budget_s=2)
    assert seen and seen[0] <= 2
    assert records[0]["status"] == "stopped" and records[0]["seconds"] < 15


def _writes(name: str, text: str):
    """A step that writes ``text`` into ``name`` in the working folder it is given (it runs from the
    repository's root, so the folder must reach it as an absolute path)."""
    return lambda work, seconds, smoke: [
        sys.executable, "-c", f"open({str(work / name)!r}, 'w').write({text!r})"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([("pass", 0)], 0),
        ([("pass", 0), ("raise SystemExit(1)", 0)], 1),
        ([("pass", 0), ("pass", 10_000)], 3),  # the second step does not fit the budget
    ],
)
def test_main_writes_the_summary_and_the_bundle(suite, tmp_path, monkeypatch, codes, expected):
    steps = [
        suite.Step(f"s{i}", f"step {i}", _py(code), cap_s=30, min_s=least)
        for i, (code, least) in enumerate(codes)
    ]
    steps.append(suite.Step("results", "writes a results file", _writes("r.json", "{}"), cap_s=30, min_s=0))
    monkeypatch.setattr(suite, "PLAN", steps)
    monkeypatch.setattr(suite, "STEPS", {s.name: s for s in steps})
    monkeypatch.chdir(tmp_path)  # a relative --work, from elsewhere than the root the steps run from
    out = tmp_path / "out"
    assert suite.main(["--budget-s", "60", "--out", str(out), "--work", "work"]) == expected
    assert sorted(p.name for p in out.iterdir()) == ["gpu_suite.json", "gpu_suite.md", "gpu_suite.tar.gz"]
    data = json.loads((out / "gpu_suite.json").read_text())
    assert [s["step"] for s in data["steps"]] == [s.name for s in steps] and data["not_reached"] == []
    md = (out / "gpu_suite.md").read_text()
    for s in steps:
        assert f"| {s.name} |" in md and s.why in md
    with tarfile.open(out / "gpu_suite.tar.gz") as tar:
        names = tar.getnames()
    ran = [s.name for s, r in zip(steps, data["steps"]) if "command" in r]
    assert {f"gpu_suite/logs/{name}.log" for name in ran} <= set(names)
    assert "gpu_suite/r.json" in names  # the results a step wrote, in the bundle


def test_steps_not_started_rewrite_the_summary_but_not_the_bundle(suite, tmp_path, monkeypatch):
    """After the budget runs out the remaining steps are recorded as not started: they change nothing in the
    work folder, so the bundle (seconds to write with ncu's reports in it) is not packed again for each."""
    steps = [suite.Step("ran", "runs", _writes("r.json", "{}"), cap_s=30, min_s=0)]
    steps += [suite.Step(f"late{i}", "does not fit", _py("pass"), cap_s=30, min_s=10_000) for i in range(3)]
    monkeypatch.setattr(suite, "STEPS", {s.name: s for s in steps})
    written = []
    real = suite.atomic_write
    monkeypatch.setattr(suite, "atomic_write", lambda path, fn: (written.append(path.name), real(path, fn)))
    out = tmp_path / "out"
    names = [s.name for s in steps]
    assert suite.main(["--steps", *names, "--out", str(out), "--work", str(tmp_path / "w")]) == 3
    # before any step, then after each: the summary five times, the bundle before any step and after "ran"
    assert written.count("gpu_suite.md") == written.count("gpu_suite.json") == 5
    assert written.count("gpu_suite.tar.gz") == 2
    with tarfile.open(out / "gpu_suite.tar.gz") as tar:
        assert "gpu_suite/r.json" in tar.getnames()
    statuses = [s["status"] for s in json.loads((out / "gpu_suite.json").read_text())["steps"]]
    assert statuses == ["ok", "not started", "not started", "not started"]


def test_main_refuses_a_working_folder_that_would_mix_runs(suite, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(SystemExit, match="--out .* lies inside --work"):
        suite.main(["--out", str(work / "out"), "--work", str(work)])
    (work / "attention_gpu_targets.json").write_text("{}")  # another run's results
    with pytest.raises(SystemExit, match="not empty"):
        suite.main(["--out", str(tmp_path / "out"), "--work", str(work)])
    assert not (tmp_path / "out").exists()


def test_the_summary_shows_the_target_checks_of_the_results_files(suite, tmp_path, monkeypatch):
    """A lease's outcome is read first in the summary: each results file's ``verdicts``, not its rows."""
    line = "triton N=512: forward 15.9 TFLOP/s (target >= 60): MISSED"

    steps = [
        suite.Step(
            "targets", "", _writes("attention_gpu_targets.json", json.dumps({"verdicts": [line]})), 30, 0
        ),
        suite.Step("torn", "", _writes("torn.json", '{"verdicts": ["cut'), 30, 0),  # a stopped step's file
    ]
    monkeypatch.setattr(suite, "PLAN", steps)
    monkeypatch.setattr(suite, "STEPS", {s.name: s for s in steps})
    out, work = tmp_path / "out", tmp_path / "work"
    assert suite.main(["--out", str(out), "--work", str(work)]) == 0
    assert json.loads((out / "gpu_suite.json").read_text())["verdicts"] == {
        "attention_gpu_targets.json": [line]
    }
    assert f"## Verdicts of `attention_gpu_targets.json`\n\n- {line}" in (out / "gpu_suite.md").read_text()


def test_main_runs_the_steps_named_and_refuses_unknown_ones(suite, tmp_path, monkeypatch, capsys):
    steps = [suite.Step(name, name, _py(f"print({name!r})"), cap_s=30, min_s=0) for name in ("a", "b", "c")]
    monkeypatch.setattr(suite, "PLAN", steps)
    monkeypatch.setattr(suite, "STEPS", {s.name: s for s in steps})
    out = tmp_path / "out"
    assert suite.main(["--steps", "c", "a", "--out", str(out), "--work", str(tmp_path / "w")]) == 0
    assert [s["step"] for s in json.loads((out / "gpu_suite.json").read_text())["steps"]] == ["c", "a"]
    with pytest.raises(SystemExit):
        suite.main(["--steps", "nope", "--out", str(out)])
    assert "unknown step(s) ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        suite.main(["--steps", "a"])  # no --out: nowhere to put the results
    assert "--out is required" in capsys.readouterr().err


def test_the_plans_commands_are_what_their_scripts_accept(suite, tmp_path):
    """Every benchmark step's arguments parse in the script it calls, name rows the attention section builds,
    and give the script a budget that leaves a margin before the step is stopped, at its cap and at its least
    time; the steps that take a budget are those whose exit status 3 means units left; the test step names
    real tests."""
    attention_gpu, attention_ncu = _module("attention_gpu"), _module("attention_ncu")
    parsers = {"attention_gpu.py": attention_gpu.parse_args, "attention_ncu.py": attention_ncu.parse_args}
    checked = set()
    for step in suite.PLAN:
        argv = step.argv(tmp_path, step.cap_s, False)
        script = Path(argv[1]).name
        if script in parsers:
            args = parsers[script](argv[2:])
            attention_gpu.check_impls(args.impls, args.models if script == "attention_gpu.py" else None)
            for spec in args.tiles if script == "attention_gpu.py" and "tiles" in args.sections else []:
                attention_gpu.parse_tiles(spec)
            assert args.budget_s <= step.cap_s - min(suite.UNIT_MARGIN_S, step.cap_s / 2)
            assert args.out.parent == tmp_path  # results land in the bundle, not over the committed ones
            least = parsers[script](step.argv(tmp_path, step.min_s, False)[2:]).budget_s
            assert 1 < least <= step.min_s / 2  # started late, a step still measures, and stops in time
            assert step.budgeted
            checked.add(script)
        else:
            assert not step.budgeted and "--budget-s" not in argv
        if argv[1:3] == ["-m", "pytest"]:
            assert all((ROOT / a).exists() for a in argv[3:] if a.startswith("tests/"))
            checked.add("pytest")
    assert checked == {"attention_gpu.py", "attention_ncu.py", "pytest"}
    sections = {a for step in suite.PLAN for a in _after(step.argv(tmp_path, 100, False), "--sections")}
    assert sections <= set(attention_gpu.SECTIONS)


def test_the_dkv_sweep_times_that_kernel_alone_by_kernel_where_it_dominates(suite, tmp_path):
    """The `tiles-dkv` step gives its shapes to the dK/dV kernel only (the others keep their tiles), on the
    distance road, timed by kernel (its own GPU time, not the call's) at 2048 and 8192, the GPU's tiles of now
    among them to compare against."""
    argv = suite.STEPS["tiles-dkv"].argv(tmp_path, 100, False)
    assert _after(argv, "--tile-kernels") == ["_dkv_kernel"]
    assert _after(argv, "--tile-timer") == ["profile"] and _after(argv, "--near-band") == ["distance"]
    assert _after(argv, "--lengths") == ["2048", "8192"]
    assert _after(argv, "--tiles") == suite.DKV_SWEEP_TILES and "64x32w4s2" in suite.DKV_SWEEP_TILES


def _after(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return []
    rest = argv[argv.index(flag) + 1 :]
    return rest[: next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]


def test_the_environment_step_records_versions_without_a_gpu(suite, tmp_path):
    path = tmp_path / "environment.json"
    assert suite.main(["--environment", str(path)]) == 0
    env = json.loads(path.read_text())
    import torch

    assert env["torch"] == torch.__version__.split("+")[0] or env["torch"] == torch.__version__
    assert {"nvidia_smi", "triton", "transformers", "flashdeberta", "ncu", "cpus", "git_commit"} <= set(env)
    assert env["kernel_source_hash"] == _module("triton_static").kernel_source_hash()
    assert env["kernel_sources"] == _module("triton_static").kernel_sources()


def test_attention_gpu_refuses_a_row_it_does_not_build(tmp_path):
    """A misspelt --impls row would otherwise be left out of the table without a word."""
    bench = _module("attention_gpu")
    with pytest.raises(SystemExit, match="unknown row\\(s\\) \\['triton distanse'\\]"):
        bench.main(["--smoke", "--impls", "triton", "triton distanse", "--out", str(tmp_path / "a.json")])
    assert not (tmp_path / "a.json").exists()
    bench.check_impls(["triton", "triton distance", "sdpa (no position terms)", "flashdeberta", "eager"])
    with pytest.raises(SystemExit, match="--models: unknown row\\(s\\) \\['ours/trition'\\]"):
        bench.main(["--smoke", "--models", "ours/trition", "--out", str(tmp_path / "a.json")])
    bench.check_impls(None, ["ours/triton", "hf eager"])


@pytest.mark.long
def test_the_real_plans_first_steps_run_in_smoke_form(suite, tmp_path):
    """`--smoke` checks the plan before a lease: the targets step measures every road and ceiling it names
    (under the interpreter, tiny shapes), the GPU tests are collected, the host side of a call and Triton's
    launch path per kernel are timed on the CPU (as on a GPU machine), and the ncu profile, which needs a GPU's
    counters, is listed as having no smoke form."""
    out, work = tmp_path / "out", tmp_path / "work"
    steps = ["environment", "dispatch", "launch-cost", "forward-settings", "targets", "ncu", "gpu-tests"]
    assert suite.main(["--smoke", "--steps", *steps, "--out", str(out), "--work", str(work)]) == 0
    summary = json.loads((out / "gpu_suite.json").read_text())
    records = {r["step"]: r for r in summary["steps"]}
    assert [records[s]["status"] for s in steps] == ["ok", "ok", "ok", "ok", "ok", "no smoke form", "ok"]
    forward = json.loads((work / "attention_gpu_forward_settings.json").read_text())
    timed = {r["impl"] for r in forward["rows"] if "fwd_ms" in r}
    assert timed == set(_after(suite.FORWARD_SETTINGS, "--impls"))
    dispatch = json.loads((work / "triton_dispatch.json").read_text())
    assert [r["road"] for r in dispatch["calls"]] == [
        "no position terms",
        "tables",
        "distance",
        "distance, the model's tables",
        "distance, a key mask",
    ]
    # every launch of a forward and a forward+backward on the distance road, through Triton's own launch path
    # (a JIT function's, though this process runs the interpreter): the forward's two kernels, the backward's
    # five, each fold kernel once for both sides
    launches = json.loads((work / "triton_launch_cost.json").read_text())["launches"]
    by_phase = {
        p: [r["kernel"] for r in launches if r["phase"] == p] for p in ("forward", "forward+backward")
    }
    assert by_phase["forward"] == ["_distance_product_kernel", "_fwd_kernel"]
    assert by_phase["forward+backward"] == [
        *by_phase["forward"],
        "_distance_product_kernel",
        "_dq_kernel",
        "_dkv_kernel",
        "_fold_product_kernel",
        "_fold_sums_kernel",
    ]
    assert all(r["us"] > 0 and r["cached_us"] > 0 for r in launches) and launches[0]["kernel"] == "_noop"
    # and a whole call, forward and forward+backward, through either path
    assert [r["phase"] for r in launches if r["phase"].startswith("call")] == [
        "call: forward, no grad",
        "call: forward+backward",
    ]
    # the backend's shorter launch path, checked against Triton's on every one of those launches first, and the
    # calls replayed from their plans against the calls themselves; both calls also timed replayed
    checked = json.loads((work / "triton_launch_cost.json").read_text())["checked"]
    assert checked["launches"] == len(by_phase["forward"]) + len(by_phase["forward+backward"])
    assert checked["planned_launches"] == len(by_phase["forward"]) + len(by_phase["forward+backward"])
    assert checked["addressed_arguments"] > 0  # the replays' launches given addresses, placed as the calls'
    assert all(r["planned_us"] > 0 for r in launches if r["phase"].startswith("call"))
    targets = json.loads((work / "attention_gpu_targets.json").read_text())
    assert targets["complete"] and targets["smoke"]
    measured = {r["impl"] for r in targets["rows"] if "fwd_bwd_ms" in r}
    assert measured >= {*suite.ROADS, *suite.CEILINGS} - {"flashdeberta"}  # flashdeberta: GPU only
    collected = re.search(r"(\d+)/\d+ tests collected", (work / "logs" / "gpu-tests.log").read_text())
    assert collected and int(collected.group(1)) > 0  # the GPU tests, by their marker


def test_gpu_tests_run_in_several_processes_where_xdist_imports(suite, monkeypatch, tmp_path):
    """The `gpu-tests` step hands pytest-xdist's ``-n TEST_WORKERS`` where it imports, nothing where it does
    not, and a smoke run only collects, in one process."""
    step = suite.STEPS["gpu-tests"]
    argv = step.argv(tmp_path, 100.0, False)
    assert argv[argv.index("-n") + 1] == str(suite.TEST_WORKERS) and "--collect-only" not in argv
    smoke = step.argv(tmp_path, 100.0, True)
    assert "--collect-only" in smoke and "-n" not in smoke
    monkeypatch.setattr(suite.importlib.util, "find_spec", lambda name: None if name == "xdist" else object())
    assert "-n" not in step.argv(tmp_path, 100.0, False)


def test_the_summary_counts_the_tests_of_pytests_junit_files(suite, tmp_path, monkeypatch):
    """The GPU tests' outcome is read in the summary too: pytest's own JUnit XML of a passing, a failing, a
    skipped and an erroring test gives their counts, every test's status and seconds, and in the Markdown the
    failing ones with their messages; a torn file (a stopped step's) is left out."""
    tests = tmp_path / "test_tiny.py"
    tests.write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def broken():\n"
        "    raise RuntimeError('no GPU memory')\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert 1 == 2, 'off by one'\n"
        "def test_skipped(): pytest.skip('no CUDA')\n"
        "def test_errors(broken): pass\n"
    )
    run = "import subprocess, sys; subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', "
    steps = [
        suite.Step(
            "gpu-tests",
            "",
            lambda work, s, smoke: [
                sys.executable,
                "-c",
                run + f"{str(tests)!r}, '--junitxml', {str(work / 'gpu_tests.xml')!r}])",
            ],
            60,
            0,
        ),
        suite.Step("torn", "", _writes("torn.xml", "<testsuites><testsuite><testcase"), 30, 0),
    ]
    monkeypatch.setattr(suite, "PLAN", steps)
    monkeypatch.setattr(suite, "STEPS", {s.name: s for s in steps})
    out, work = tmp_path / "out", tmp_path / "work"
    assert suite.main(["--out", str(out), "--work", str(work)]) == 0
    found = json.loads((out / "gpu_suite.json").read_text())["tests"]
    assert list(found) == ["gpu_tests.xml"]
    assert found["gpu_tests.xml"]["summary"] == {"passed": 1, "failure": 1, "error": 1, "skipped": 1}
    status = {t["test"].split("::")[-1]: t["status"] for t in found["gpu_tests.xml"]["tests"]}
    assert status == {
        "test_passes": "passed",
        "test_fails": "failure",
        "test_skipped": "skipped",
        "test_errors": "error",
    }
    assert all(t["seconds"] >= 0 for t in found["gpu_tests.xml"]["tests"])
    md = (out / "gpu_suite.md").read_text()
    assert "## Tests of `gpu_tests.xml`: 1 passed, 1 failure, 1 error, 1 skipped" in md
    # (the module as pytest names it from its root, which depends on where the temporary folder lies)
    assert re.search(r"- failure: `[^`]*test_tiny::test_fails`: .*off by one", md)
    assert re.search(r"- error: `[^`]*test_tiny::test_errors`: .*no GPU memory", md)
    assert "test_passes" not in md and "test_skipped" not in md
