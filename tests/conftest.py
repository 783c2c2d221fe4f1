import os
from pathlib import Path

import pytest
import torch

# Without CUDA, Triton kernels run in Triton's interpreter. The variable must be set before any kernel is
# defined, and any test module may be the first to import them: set it here, once, for the whole session.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (`make test` runs one worker per core) each worker takes its share of the cores: with
# torch's default, a thread per core in every worker, the workers' threads contend for the same cores
# (the cores this process may run on, as xdist's `-n auto` counts them without psutil)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, _CORES // _WORKERS))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _poison_unfilled_buffers(monkeypatch):
    # the triton backend's distance buffers that its kernels must write whole start as NaN in every test: a
    # missed cell shows in the gradients instead of reading whatever the allocator left there
    from debertakit.attention import triton_backend

    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)


@pytest.fixture(autouse=True)
def _release_cuda_cache():
    # GPU tests in several processes (`benchmarks/gpu_suite.py`'s `gpu-tests` step): each process's caching
    # allocator would keep what its tests freed, out of the others' reach (under `-n 8`, before this, six tests
    # ran out of GPU memory beside each other)
    yield
    if _WORKERS > 1 and torch.cuda.is_available():
        torch.cuda.empty_cache()


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the shares are of what runs
def pytest_collection_modifyitems(config, items):
    items[:] = spread_long_tests(items, _WORKERS)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def first_shares(n: int, workers: int) -> list[int]:
    """The sizes of the contiguous shares of ``n`` tests that pytest-xdist's worksteal scheduler first hands its
    workers, in order (as `WorkStealingScheduling.check_schedule` divides them)."""
    sizes, left = [], n
    for k in range(workers):
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    return sizes


def spread_long_tests(items: list, workers: int) -> list:
    """The tests marked `long` (half a minute or more each) at the heads of the shares that pytest-xdist's worksteal
    scheduler first hands its workers, round robin: it hands worker k the k-th contiguous share of the
    collection (sizes as below) and steals from the shares' ends, so that a long test collected late starts
    late (the slow run's compile check of every variant: 22 min, its last 8 on one worker). Every worker
    reorders its collection the same way, as xdist requires. Unchanged for one worker."""
    long = [item for item in items if "long" in item.keywords]
    if workers < 2 or not long:
        return list(items)
    rest = [item for item in items if "long" not in item.keywords]
    ordered = []
    for k, share in enumerate(first_shares(len(items), workers)):
        heads = long[k::workers]
        take = max(0, share - len(heads))
        ordered += heads + rest[:take]
        rest = rest[take:]
    return ordered + rest


@pytest.fixture(scope="session")
def task_tokenizer_dir(tmp_path_factory) -> Path:
    """A small SentencePiece vocabulary trained on WikiText-2 (for featurisation and fine-tuning tests)."""
    corpus = SHARED_DATA / "text" / "wikitext-2-valid.txt"
    if not corpus.exists():
        pytest.skip(f"shared data file {corpus} is absent")
    from debertakit.tokenization import train_tokenizer

    out = tmp_path_factory.mktemp("task_spm")
    train_tokenizer([corpus], 2000, "spm", out, progress=False, max_sentences=2000)
    return out


@pytest.fixture(scope="session")
def task_tokenizer(task_tokenizer_dir):
    from debertakit import load_tokenizer

    return load_tokenizer(task_tokenizer_dir)
