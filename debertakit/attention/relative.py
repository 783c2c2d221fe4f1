"""Relative positions: from a distance i - j to a row of the relative-position table.

Every backend indexes the projected relative table through `RelativeIndex`, so they all agree on the exact same
rows (REFERENCE.md §2):

* no buckets (v1): ``idx = clamp(i - j + k, 0, 2k - 1)``
* log buckets (v2/v3): ``idx = clamp(bucket(i - j) + span, 0, 2 * span - 1)`` with the bucket function below.

c2p and p2c use the same index, built from i - j (the released code does, not the paper's δ(j, i)).

Because the index saturates beyond a distance ``saturation`` (about 511 for v2/v3, k for v1), it is stored as a
small lookup table over ``[-saturation, saturation]``; far pairs clamp into the table's ends. Fast backends use the
same table, and the saturation distance tells them where the position terms stop depending on the distance.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


def log_bucket(delta: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa-v2 log buckets of relative distances, as Hugging Face computes them (float32 arithmetic).

    Distances with ``|r| <= bucket_size // 2`` keep their value; larger ones grow logarithmically. There is no
    clamp of ``|r|`` to ``max_position - 1`` before the log (the official repository clamps; the two differ only
    beyond 512, where the table index saturates anyway except for one row on the left side).
    """
    sign = torch.sign(delta)
    mid = bucket_size // 2
    abs_pos = torch.where(
        (delta < mid) & (delta > -mid), torch.tensor(mid - 1).type_as(delta), torch.abs(delta)
    )
    log_pos = (
        torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1))
        + mid
    )
    return torch.where(abs_pos <= mid, delta.type_as(log_pos), log_pos * sign).to(torch.long)


def _raw_index(delta: Tensor, span: int, bucket_size: int, max_position: int) -> Tensor:
    if bucket_size > 0:
        delta = log_bucket(delta, bucket_size, max_position)
    return torch.clamp(delta + span, 0, 2 * span - 1)


@dataclass(frozen=True)
class RelativeIndex:
    """Maps relative distances ``i - j`` to rows ``[0, 2 * span)`` of the relative table, minus ``offset``.

    ``offset`` is set when only a window of the table is projected (`window`): backends then index rows of the
    window directly.
    """

    span: int
    bucket_size: int = 0
    max_position: int = 0
    offset: int = 0
    lut: Tensor = field(init=False, repr=False, compare=False)
    saturation: int = field(init=False, compare=False)
    _device_luts: dict = field(init=False, repr=False, compare=False, default_factory=dict)
    _derived: OrderedDict = field(init=False, repr=False, compare=False, default_factory=OrderedDict)
    _rows: tuple[int, ...] = field(init=False, repr=False, compare=False)  # `lut` as Python ints (`row`)

    def __post_init__(self) -> None:
        far = 4 * max(self.span, self.max_position, 1) + 8
        deltas = torch.arange(-far, far + 1)
        idx = _raw_index(deltas, self.span, self.bucket_size, self.max_position)
        # smallest D such that idx is constant for all delta >= D and for all delta <= -D
        right = idx[far:]  # delta = 0 .. far
        left = idx[: far + 1].flip(0)  # delta = 0 .. -far
        d_right = int((right != right[-1]).nonzero().max()) + 1 if (right != right[-1]).any() else 0
        d_left = int((left != left[-1]).nonzero().max()) + 1 if (left != left[-1]).any() else 0
        sat = max(d_right, d_left, 1)
        object.__setattr__(self, "saturation", sat)
        object.__setattr__(self, "lut", idx[far - sat : far + sat + 1] - self.offset)
        object.__setattr__(self, "_rows", tuple(self.lut.tolist()))

    @classmethod
    def from_config(cls, cfg) -> RelativeIndex:
        return cls(
            span=cfg.rel_span, bucket_size=cfg.position_buckets, max_position=cfg.max_relative_positions
        )

    @property
    def table_rows(self) -> int:
        return 2 * self.span

    def lut_on(self, device: torch.device | str) -> Tensor:
        """`lut` on ``device``, copied from the host once per device and kept. A copy in every layer's call would
        make the host wait for the GPU in every layer: a copy from pageable host memory synchronises the stream,
        and the host can no longer queue work ahead. Under ``torch.compile`` the copy is traced instead (a
        constant of the graph)."""
        device = torch.device(device)
        if device.type == "cpu" or torch.compiler.is_compiling():
            return self.lut.to(device)
        if device not in self._device_luts:
            with torch.inference_mode(False):  # kept: a normal tensor, whatever mode the first call ran in
                self._device_luts[device] = self.lut.to(device)
        return self._device_luts[device]

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per ``key`` and kept with this mapping (the `DERIVED_KEPT` latest keys):
        what a backend derives from the mapping and the shapes alone (its lookup tables on a device, say), which
        would otherwise be built again in every forward. Inputs that depend on the masks belong to the forward's
        `Geometry` (`Geometry.cached`). Under ``torch.compile`` it is always built (part of the graph), and so
        while a CUDA graph is captured: a tensor made then lives in that graph's private memory pool, which is
        handed out again once the graph is freed, so it must not outlive the graph in this cache (`kept`)."""
        return kept(self._derived, key, build, DERIVED_KEPT)

    def index(self, delta: Tensor) -> Tensor:
        """Row (int64, relative to ``offset``) for every distance in ``delta`` (any shape, any integer dtype)."""
        lut = self.lut_on(delta.device)
        return lut[torch.clamp(delta, -self.saturation, self.saturation).long() + self.saturation]

    def row(self, delta: int) -> int:
        """`index` of one distance given as a Python int, on the host: no tensor, so nothing to copy to a device
        (which would wait for the GPU, and is an error inside a CUDA graph's capture) and a constant when traced."""
        return self._rows[min(max(delta, -self.saturation), self.saturation) + self.saturation]

    def window(self, max_distance: int) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of the full table used by distances in ``[-max_distance, max_distance]``.

        The index is monotone in the distance, so the used rows are contiguous; projecting only them is exact
        and saves work for short inputs (a 1024-row v1 table for a 16-token input, say).
        """
        d = min(max_distance, self.saturation)
        lo = self.row(-d) + self.offset
        hi = self.row(d) + self.offset + 1
        return lo, hi

    def shifted(self, lo: int) -> RelativeIndex:
        """The same mapping, relative to a table window starting at full-table row ``lo``."""
        if lo == self.offset:
            return self
        return _relative_index(self.span, self.bucket_size, self.max_position, lo)


def kept(entries: OrderedDict, key: Hashable, build: Callable[[], Any], limit: int) -> Any:
    """``build()``, computed once per ``key`` and kept in ``entries`` (the ``limit`` latest keys: the least
    recently used is dropped). Built anew and not kept under ``torch.compile`` (part of the graph). While a CUDA
    graph is captured, an entry kept before (by the warm-up forwards a capture follows) serves, and is pinned
    (`_CAPTURED`): the graph reads its memory at every replay, so dropping it from ``entries`` must not free it;
    otherwise built anew and not kept, since a tensor made then lives in that graph's private memory pool, which
    is handed out again once the graph is freed. (Built anew in every capture, a v3 call's lookup tables and
    distance cells were 20 small kernels in every layer of every replay.) Built outside ``torch.inference_mode``:
    a forward with grad after an inference one would save the kept tensors for its backward, which inference
    tensors cannot be."""
    if torch.compiler.is_compiling():
        return build()
    if capturing_cuda_graph():
        if key not in entries:
            return build()
        _CAPTURED[id(entries[key])] = entries[key]
        return entries[key]
    if key in entries:
        entries.move_to_end(key)
    else:
        with torch.inference_mode(False):
            entries[key] = build()
        if len(entries) > limit:
            entries.popitem(last=False)
    return entries[key]


# Entries `kept` served to a CUDA graph's capture, by identity: never dropped, as the graph may be replayed for as
# long as the process runs (a few small tensors per captured shape).
_CAPTURED: dict[int, Any] = {}


def capturing_cuda_graph() -> bool:
    """Whether the current CUDA stream is being captured into a graph (`torch.cuda.graph`): no reading the GPU
    from the host then (``.item()`` is an error), and what is allocated belongs to the graph's memory pool."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# Entries `RelativeIndex.cached` keeps per mapping: a few per device and input length (inputs of many lengths,
# as a server sees, keep the latest ones).
DERIVED_KEPT = 64


@functools.lru_cache(maxsize=256)
def _relative_index(span: int, bucket_size: int, max_position: int, offset: int) -> RelativeIndex:
    """One instance per mapping and window, reused across forwards with its copies on devices (`lut_on`)."""
    return RelativeIndex(span, bucket_size, max_position, offset)


def scale_for(head_dim: int, scale_factor: int) -> float:
    """1 / sqrt(d * sf) (REFERENCE.md §1), as a Python float so every backend uses the same value."""
    return 1.0 / math.sqrt(head_dim * scale_factor)
