"""Memory of one `chunked` call at N = 4096 (under a bound an O(N²) implementation cannot meet), backend
selection ("auto", named, errors), and padding-free batches through the whole model with every backend."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import debertakit
from debertakit.attention import Geometry, PositionTerms, RelativeIndex, Request, eager_attention, get_backend
from debertakit.attention.chunked import chunked_attention
from debertakit.model.backbone import DebertaModel


class PeakTensorMemory(TorchDispatchMode):
    """Peak bytes held by tensors created by PyTorch operators (a storage counts until its last tensor dies).

    It sees every operator output, so an implementation that materialises an N×N score matrix, index or mask
    is seen; only scratch space inside a single fused kernel is not.
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, list] = {}  # data_ptr -> [bytes, live tensor count]
        self.current = 0
        self.peak = 0

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr == 0:
                continue
            entry = self.live.get(ptr)
            if entry is None:
                entry = self.live[ptr] = [t.untyped_storage().nbytes(), 0]
                self.current += entry[0]
                self.peak = max(self.peak, self.current)
            entry[1] += 1
            weakref.finalize(t, self._release, ptr)
        return out


N = 4096


def _long_inputs(grad: bool, n: int = N):
    g = torch.Generator().manual_seed(0)
    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    lo, hi = rel.window(n - 1)
    q, k, v = (torch.randn(1, 1, n, 16, generator=g, requires_grad=grad) for _ in range(3))
    pos_q, pos_k = (torch.randn(1, hi - lo, 16, generator=g, requires_grad=grad) for _ in range(2))
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[:, -100:] = False  # padding: the mask path is exercised too
    return q, k, v, pos_q, pos_k, rel.shifted(lo), Geometry(key_mask=mask)


def _peak(fn, grad: bool) -> int:
    inputs = _long_inputs(grad)
    kw = dict(scale=0.1, terms=PositionTerms(True, True, False))
    with PeakTensorMemory() as mem:
        if grad:
            out, _ = fn(*inputs, **kw)
            out.square().sum().backward()
            del out
        else:
            with torch.no_grad():
                fn(*inputs, **kw)
    return mem.peak


N2_FP32 = N * N * 4  # one N×N float32 matrix: 64 MiB; an O(N²) implementation holds at least this


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "forward+backward"])
def test_chunked_memory_at_4096_is_below_one_n_by_n_matrix(grad):
    peak = _peak(chunked_attention, grad)
    assert peak < N2_FP32, (
        f"chunked peak {peak / 2**20:.1f} MiB >= {N2_FP32 / 2**20:.0f} MiB (one N×N fp32 matrix)"
    )


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _resident_growth(fn, warm_up) -> int:
    """Bytes the resident set grows to above where it stood, during ``fn()`` (Linux: the high-water mark is
    reset through /proc/self/clear_refs). Sees allocations PyTorch's dispatcher does not: a compiled kernel's.
    The warm-up is a small call (code paged in, the kernel built), not ``fn`` itself: freed scratch may stay in
    the allocator's heap, and a second call reusing it would not grow the resident set."""
    warm_up()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) * 1024


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity"), reason="needs Linux /proc")
def test_compiled_kernel_memory_at_4096_is_below_one_n_by_n_matrix():
    """The compiled CPU kernel's scratch (per thread: N×R p2c rows and one block of scores) against the same
    bound, measured on the resident set; the same probe on eager exceeds it."""
    kw = dict(scale=0.1, terms=PositionTerms(True, True, False))

    def call(fn, n: int = N, **extra):
        inputs = _long_inputs(grad=False, n=n)

        def once():
            with torch.no_grad():
                fn(*inputs, **kw, **extra)

        return once

    assert _resident_growth(call(eager_attention), call(eager_attention, n=64)) > N2_FP32
    kernel = dict(fused=True)
    grown = _resident_growth(call(chunked_attention, **kernel), call(chunked_attention, n=64, **kernel))
    assert grown < N2_FP32, f"compiled kernel grew the resident set by {grown / 2**20:.1f} MiB"


def test_the_memory_probe_sees_an_n_by_n_implementation():
    """The same probe on `eager` exceeds the bound: the test above can fail."""
    assert _peak(eager_attention, grad=False) > N2_FP32


# ---- selection ---------------------------------------------------------------------------------------------


def _request(**kw):
    base = dict(device_type="cpu", dtype=torch.float32, seq_len=512, head_dim=64)
    return Request(**{**base, **kw})


def test_auto_picks_chunked_on_cpu_and_eager_for_probabilities(caplog):
    assert get_backend("auto", _request()).name == "chunked"
    assert get_backend("auto", _request(seq_len=8192, dtype=torch.bfloat16, packed=True)).name == "chunked"
    assert get_backend("auto", _request(dropout=True)).name == "chunked"
    assert get_backend("auto", _request(needs_probs=True)).name == "eager"


def test_named_backend_that_cannot_run_raises_clearly():
    with pytest.raises(ValueError, match=r"'chunked' cannot run this call: .*probabilities"):
        get_backend("chunked", _request(needs_probs=True))
    with pytest.raises(ValueError, match=r"'flex' cannot run this call: .*dropout"):
        get_backend("flex", _request(dropout=True))
    with pytest.raises(ValueError, match=r"unknown attention backend 'flashy'.*'chunked'.*'eager'.*'flex'"):
        get_backend("flashy", _request())


def test_auto_leaves_triton_kernels_on_gpus_without_their_tensor_cores():
    """Below compute capability 8.0 Triton compiles matrix products without tensor cores (`triton_backend.
    TRITON_TENSOR_CORES`): there `auto` leaves `triton` for `chunked` (cuBLAS), and a call naming `triton` says
    why it cannot run."""
    assert "triton" in debertakit.attention.available_backends()  # the test extra installs Triton
    for capability in ((8, 0), (8, 6), (9, 0), (12, 0), None):  # None: a GPU of unknown capability (ROCm)
        assert get_backend("auto", _request(device_type="cuda", capability=capability)).name == "triton"
    for capability in ((7, 5), (7, 0)):
        turing = _request(device_type="cuda", dtype=torch.float16, capability=capability)
        assert get_backend("auto", turing).name == "chunked"
        with pytest.raises(
            ValueError, match=rf"compute capability 8.0 or newer, this one is {capability[0]}."
        ):
            get_backend("triton", turing)
        assert get_backend("flex", turing).name == "flex"  # named, it still runs
    # in training `eager` there: `chunked`'s CPU-sized tiles are slow on a GPU (see the next test)
    assert get_backend("auto", _request(device_type="cuda", capability=(7, 5), grad=True)).name == "eager"


def test_auto_never_picks_flex():
    """Measured slower than `eager` on a GPU at every length (see `flex._priority`); on CPU a reference path."""
    for device_type in ("cuda", "cpu"):
        for grad in (False, True):
            unfused = _request(device_type=device_type, head_dim=256, grad=grad)  # triton declines
            assert get_backend("auto", unfused).name in ("chunked", "eager")
            assert get_backend("flex", unfused).name == "flex"


def test_auto_trains_with_eager_where_no_fused_kernel_runs_on_a_gpu():
    """`chunked` is first on the CPU, in training too, and on a GPU at inference; training on a GPU without the
    fused kernels (dense masks with dropout, head dims above 128, older GPUs) takes `eager`."""
    assert get_backend("auto", _request(grad=True)).name == "chunked"
    assert get_backend("auto", _request(grad=True, dropout=True, dense_mask=True)).name == "chunked"
    unfused = dict(device_type="cuda", dtype=torch.bfloat16, head_dim=256, dropout=True)
    assert get_backend("auto", _request(**unfused)).name == "chunked"
    assert get_backend("auto", _request(**unfused, grad=True)).name == "eager"
    # where the fused kernel runs it is first, in training too
    assert get_backend("auto", _request(device_type="cuda", grad=True, dropout=True)).name == "triton"


def test_device_capability_is_nvidias_only(monkeypatch):
    from debertakit.attention.registry import device_capability

    assert device_capability(torch.device("cpu")) is None
    turing = type("Properties", (), {"major": 7, "minor": 5})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: turing)
    assert device_capability(torch.device("cuda", 0)) == (7, 5)
    monkeypatch.setattr(torch.version, "hip", "6.2.0")  # a ROCm build: "cuda" is an AMD GPU
    assert device_capability(torch.device("cuda", 0)) is None


def test_attention_layers_tell_the_registry_their_device_and_whether_they_train(monkeypatch):
    from debertakit.model import layers

    seen = []

    def recording(name, request):
        seen.append(request)
        return get_backend(name, request)

    monkeypatch.setattr(layers, "get_backend", recording)
    monkeypatch.setattr(layers, "device_capability", lambda device: (7, 5) if device.type == "cpu" else None)
    model = DebertaModel(debertakit.DebertaConfig.preset("tiny-v3")).eval()
    ids = torch.randint(5, 50, (1, 9))
    model(input_ids=ids)
    assert seen and {(r.capability, r.grad) for r in seen} == {((7, 5), True)}  # parameters require grad
    seen.clear()
    with torch.no_grad():
        model(input_ids=ids)
    assert seen and {r.grad for r in seen} == {False}


def test_model_with_named_backend_asking_for_attentions_raises():
    cfg = debertakit.DebertaConfig.preset("tiny-v3", attention_backend="chunked")
    model = DebertaModel(cfg).eval()
    with pytest.raises(ValueError, match="chunked"):
        model(input_ids=torch.randint(5, 50, (1, 9)), output_attentions=True)


# ---- padding-free batches through the model ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "chunked", "flex"])
@pytest.mark.parametrize("preset", ["tiny-v3", "tiny-v1", "tiny-v2"])
def test_packed_model_equals_each_sequence_alone(backend, preset):
    cfg = debertakit.DebertaConfig.preset(preset, attention_backend=backend)
    torch.manual_seed(0)
    model = DebertaModel(cfg).eval()
    lengths = [7, 30, 1, 19]
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(5, cfg.vocab_size, (n,), generator=g) for n in lengths]
    ids = torch.cat(seqs)[None]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    emb = model.embeddings.word(ids).detach().requires_grad_(True)
    packed = model(inputs_embeds=emb, cu_seqlens=cu).last_hidden_state  # (1, T, H)
    w = torch.randn(packed.shape, generator=g)
    (packed * w).sum().backward()
    for s, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        e = emb.detach()[:, a:b].clone().requires_grad_(True)
        alone = model(inputs_embeds=e).last_hidden_state
        err = (alone - packed[:, a:b]).abs().max().item()
        assert err <= 1e-5, f"{backend} {preset}: sequence {s} differs by {err:.3g}"
        (alone * w[:, a:b]).sum().backward()
        gerr = (e.grad - emb.grad[:, a:b]).abs().max().item()
        tol = 1e-5 * max(1.0, e.grad.abs().max().item())  # LayerNorm (eps 1e-7) gradients can be large
        assert gerr <= tol, f"{backend} {preset}: input gradient of sequence {s} differs by {gerr:.3g}"
