"""`triton_launch`: the backend's shorter launch path. Its key and its bookkeeping here, with a stand-in JIT
function and compiled kernel; against Triton's own path on every launch of a forward and a forward+backward, with
real JIT functions, in `benchmarks/triton_launch_cost.py`'s check (run by the GPU suite's smoke test)."""

from types import SimpleNamespace

import pytest
import torch

from debertakit.attention import triton_backend, triton_launch
from debertakit.attention.triton_launch import _key, launcher


def test_interpreted_kernels_and_stand_ins_launch_as_they_are():
    """Under the interpreter the kernels are not JIT functions: the launcher is the kernel itself, as for any
    object that is not one (the benchmarks' kernels that launch nothing)."""
    kernel = triton_backend._kernels()._fwd_kernel
    assert launcher(kernel) is kernel
    stand_in = object()
    assert launcher(stand_in) is stand_in


def test_the_launch_path_setting_is_checked(monkeypatch):
    monkeypatch.setattr(triton_launch, "LAUNCH_PATH", "fast")
    with pytest.raises(ValueError, match=r"LAUNCH_PATH must be one of \('cached', 'triton'\), got 'fast'"):
        launcher(object())


def test_the_key_holds_what_triton_specialises_on():
    """Values that compare equal across types (True == 1 == 1.0) key apart; floats by their type alone; tensors,
    positional or by keyword, by dtype and 16-byte alignment, not by identity or shape; a kind not keyed gives
    None (Triton's path)."""
    assert len({_key((x,), {}) for x in (1, True, 1.0)}) == 3
    assert _key((0.5,), {}) == _key((0.25,), {})
    assert _key((16,), {}) != _key((32,), {})
    assert _key((), {"FLAG": True}) != _key((), {"FLAG": 1})
    assert _key((), {"A": 1, "B": 2}) != _key((), {"B": 2, "A": 1})  # the names in order: the tail's order
    x = torch.empty(64, dtype=torch.bfloat16)
    aligned, shifted = x[8:], x[1:]  # 16 bytes in, 2 bytes in
    assert _key((x,), {}) == _key((aligned,), {}) == _key((x.view(8, 8).t(),), {})
    assert _key((x,), {}) != _key((shifted,), {})
    assert _key((x,), {}) != _key((x.float(),), {})
    assert _key((), {"SEED": torch.zeros(1)}) == _key((), {"SEED": torch.ones(1)})
    assert _key((x,), {}) == _key((torch.nn.Parameter(x),), {})
    assert _key(("text",), {}) is None


class _Kernel:
    """Stands for a compiled kernel: records each launch's arguments."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, calls):
        self.calls = calls

    def launch_metadata(self, grid, stream, *values):
        return ("metadata of", grid, stream)

    def run(self, *args):
        self.calls.append(("kept", args))


class _Fn:
    """Stands for a JIT function of parameters (X, N, BLOCK): Triton's path records the launch and returns the
    compiled kernel."""

    arg_names = ["X", "N", "BLOCK"]
    pre_run_hooks: list = []

    def __init__(self):
        self.calls: list = []
        self.kernel = _Kernel(self.calls)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append(("triton", grid, args, kwargs))
            return self.kernel

        return run


def _cached(monkeypatch):
    fn = _Fn()
    cached = triton_launch.Cached(fn)
    device = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: "stream")
    monkeypatch.setattr(cached, "_driver", SimpleNamespace(active=device))
    return fn, cached


def test_a_kept_kernel_is_launched_with_the_arguments_tritons_path_passes(monkeypatch):
    """The first launch of a key goes through Triton's path; later ones call the kernel it returned, with the
    grid (padded to three axes), the stream, its function and metadata, the launch hooks and every parameter
    in the signature's order (a launch option like ``num_warps`` is not one)."""
    fn, cached = _cached(monkeypatch)
    x = torch.empty(64)
    for _ in range(2):
        cached[(3,)](x, 5, num_warps=4, BLOCK=16)
    assert [c[0] for c in fn.calls] == ["triton", "kept"]
    hooks = triton_launch.Cached(fn)._knobs.runtime
    expected = (3, 1, 1, "stream", "function", "metadata", ("metadata of", (3,), "stream"))
    assert fn.calls[1][1] == (*expected, hooks.launch_enter_hook, hooks.launch_exit_hook, x, 5, 16)
    cached[(3,)](x[1:], 5, num_warps=4, BLOCK=16)  # another alignment: another key, Triton's path
    cached[(3,)](x, 6, num_warps=4, BLOCK=16)  # another value
    cached[(3,)](x, 5, num_warps=8, BLOCK=16)  # another option
    assert [c[0] for c in fn.calls[2:]] == ["triton"] * 3
    assert len(cached.entries) == 4


def test_addresses_are_taken_only_by_kept_kernels_without_launch_hooks(monkeypatch):
    """A key's launch may be given addresses for tensors once Triton's path has returned its compiled kernel
    (before, Triton's path would read an int as an integer), and not while a launch hook is set."""
    fn, cached = _cached(monkeypatch)
    x = torch.empty(64)
    key = cached.key((1,), (x, 5), {"BLOCK": 16})
    assert not cached.takes_addresses(key)
    cached[(1,)](x, 5, BLOCK=16)
    assert cached.takes_addresses(key)
    runtime = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(cached, "_knobs", SimpleNamespace(runtime=runtime))
    assert cached.takes_addresses(key)
    runtime.launch_exit_hook = print  # (a hook set in the chain's place)
    assert not cached.takes_addresses(key)
    chain = SimpleNamespace(calls=[])  # the checked releases chain hooks: an empty chain is none
    runtime.launch_enter_hook, runtime.launch_exit_hook = chain, None
    assert cached.takes_addresses(key)
    chain.calls.append(print)
    assert not cached.takes_addresses(key)


def test_a_launch_that_leaves_a_parameter_to_its_default_is_never_kept(monkeypatch):
    fn, cached = _cached(monkeypatch)
    for _ in range(2):
        cached[(1,)](torch.empty(4), 5)  # BLOCK not given
    assert [c[0] for c in fn.calls] == ["triton", "triton"] and not cached.entries


def test_the_kept_kernels_are_bounded(monkeypatch):
    """Keys hold shapes by value: past `MAX_ENTRIES` the older half goes."""
    monkeypatch.setattr(triton_launch, "MAX_ENTRIES", 4)
    fn, cached = _cached(monkeypatch)
    x = torch.empty(4)
    for n in range(5):
        cached[(1,)](x, n, BLOCK=16)
    assert len(cached.entries) == 3  # 4 kept, the older 2 dropped, then the fifth
    cached[(1,)](x, 4, BLOCK=16)
    assert fn.calls[-1][0] == "kept"
    cached[(1,)](x, 0, BLOCK=16)
    assert fn.calls[-1][0] == "triton"


def test_the_shorter_path_serves_only_the_checked_triton_releases(monkeypatch):
    import triton

    first, last = triton_launch.CHECKED_RELEASES
    monkeypatch.setattr(triton_launch, "_checked_release", triton_launch._checked_release.__wrapped__)
    for version, served in [
        (f"{first[0]}.{first[1]}.0", True),
        (f"{last[0]}.{last[1]}.1", True),
        (f"{first[0]}.{first[1] - 1}.2", False),
        (f"{last[0]}.{last[1] + 1}.0", False),
    ]:
        monkeypatch.setattr(triton, "__version__", version)
        assert triton_launch._checked_release() is served, version
    assert triton_launch.minor_release("3.6rc1") == (3, 6)
    with pytest.raises(ValueError, match="cannot read a version from 'dev'"):
        triton_launch.minor_release("dev")


@pytest.mark.gpu
def test_both_launch_paths_give_the_same_results_gpu(monkeypatch):
    """On CUDA the backend's JIT kernels go through the shorter path (where the installed Triton is a checked
    release), and a forward+backward gives bit for bit what Triton's own path gives."""
    from debertakit.attention.eager import PositionTerms
    from debertakit.attention.geometry import Geometry
    from debertakit.attention.relative import RelativeIndex
    from tests.attention.test_triton import deterministic_algorithms

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()

    q, k, v = (leaf(2, 700, 4, 64).transpose(1, 2) for _ in range(3))
    tables = [leaf(4, rel.table_rows, 64) for _ in range(2)]
    terms = PositionTerms(c2p=True, p2c=True)
    results = {}
    for path in triton_launch.LAUNCH_PATH_MODES:
        monkeypatch.setattr(triton_launch, "LAUNCH_PATH", path)
        # the tables' rows summed in a fixed order (`_into_rows`): CUDA's index_add_ rounds apart run to run
        with deterministic_algorithms(monkeypatch, warn_only=True):
            out, _ = triton_backend.triton_attention(
                q, k, v, *tables, rel, Geometry(), scale=0.1, terms=terms
            )
            grads = torch.autograd.grad(out, (q, k, v, *tables), torch.ones_like(out))
        results[path] = (out, *grads)
    assert all(torch.equal(a, b) for a, b in zip(*results.values()))
    cached = triton_launch._LAUNCHERS.get(id(triton_backend._kernels()._fwd_kernel))
    assert bool(cached is not None and cached.entries) == triton_launch._checked_release()
