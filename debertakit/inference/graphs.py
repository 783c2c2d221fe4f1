"""CUDA graphs for serving: a model's forward recorded once per input-size bucket, then replayed.

At batch 1 an encoder's forward is set by the host, not the GPU: a v3-base forward of 128 tokens launches about
500 GPU kernels, 1.25 ms of GPU time on an H200, while the host's work of launching them (the Python of 12
layers) took 12 to 24 ms per forward (README, "Measured on an H100 and an H200";
`benchmarks/attention_gpu.py --sections latency`). A CUDA graph records the launches of one forward and replays
them with one call. `CudaGraphModel` wraps an evaluation-mode model: inputs are padded to the
next bucket of lengths and batch sizes (padding masked as keys, so the real tokens' outputs are those of the
unpadded input: padding only adds keys that nothing attends to), copied into the bucket's input buffers, the
bucket's graph is replayed, and the outputs are cut back to the real rows and tokens (copies: the graph writes
the same buffers at every replay).

A bucket's graph is captured at its first use: two forwards on a side stream first (they compile the kernels and
fill the caches that live across forwards, such as the attention backends' lookup tables on the device), then the
capture. Inside it the model does not read the GPU from the host (no ``.item()``: the token-id range check runs
on the caller's inputs before they are copied in) and fills no cache that outlives the forward (what the capture
allocates belongs to the graph: `debertakit.model.layers.inference_cache_ok`). All graphs share one memory pool.

What a graph holds fixed: the shapes of its bucket, the dtype under autocast (part of the bucket's key; under
autocast the graph casts the weights at every replay: a model converted to bfloat16 or float16 is faster), the
parameters' memory (weights changed in place, ``load_state_dict`` say, are read by later replays; parameters
replaced by new tensors, ``model.to(...)`` say, are not: build a new wrapper). Inputs longer than the longest
bucket or larger batches run the model's own forward.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from debertakit.model.backbone import check_inputs
from debertakit.model.outputs import (
    BackboneOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
    TokenLogitsOutput,
)

DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
WARMUP_FORWARDS = 2

# the outputs' fields with one entry per token (B, N, ...); every other tensor field has one per sequence (B, ...)
_PER_TOKEN: dict[type, tuple[str, ...]] = {
    BackboneOutput: ("last_hidden_state", "penultimate_hidden_state"),
    MaskedLMOutput: ("logits",),
    TokenLogitsOutput: ("logits",),
    QuestionAnsweringOutput: ("start_logits", "end_logits"),
}


def bucket(size: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest of ``sizes`` (ascending) that holds ``size``; None when none does."""
    return next((s for s in sizes if s >= size), None)


def _check_sizes(name: str, sizes: tuple[int, ...]) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes) or list(sizes) != sorted(set(sizes)):
        raise ValueError(f"{name} must be increasing positive ints; got {sizes!r}")
    return sizes


class _Bucket:
    """One bucket's input buffers, its graph (None without replay) and its output (the graph's buffers)."""

    def __init__(self, inputs: dict[str, Tensor]):
        self.inputs = inputs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: Any = None

    def load(self, pad_id: int, input_ids: Tensor, mask: Tensor | None, types: Tensor | None) -> None:
        """The real rows and tokens into the buffers' leading corner; padding ids, a zero mask (hidden keys)
        and type 0 everywhere else."""
        b, n = input_ids.shape[0], input_ids.shape[-1]
        self.inputs["input_ids"].fill_(pad_id)[:b, ..., :n].copy_(input_ids)
        keys = self.inputs["attention_mask"].zero_()[:b, ..., :n]
        if mask is None:
            keys.fill_(1)
        else:
            keys.copy_(mask)
        if types is not None:
            self.inputs["token_type_ids"].zero_()[:b, ..., :n].copy_(types)


class CudaGraphModel(nn.Module):
    """``model``'s forward as replayed CUDA graphs, one per (batch size, length) bucket (see the module docstring).

    Called like the model with ``input_ids`` (B, N), or (B, choices, N) for multiple choice, and optionally an
    ``attention_mask`` of the same shape (1 for real tokens; 2-D padding masks only) and ``token_type_ids``;
    returns the model's output type cut to the B rows and N tokens. Wrapping puts ``model`` in evaluation mode
    (the graphs hold no dropout), and the wrapper runs it under ``torch.no_grad``.

    Args:
        model: a debertakit model (`DebertaModel` or a task model) on a CUDA device.
        lengths: the length buckets, increasing.
        batch_sizes: the batch buckets, increasing.
        replay: False runs each bucket's padded forward directly, without a graph: the same inputs and outputs,
            on any device (how the padding is checked on a CPU).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        lengths: tuple[int, ...] = DEFAULT_LENGTHS,
        batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
        replay: bool = True,
    ):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.lengths = _check_sizes("lengths", lengths)
        self.batch_sizes = _check_sizes("batch_sizes", batch_sizes)
        self.device = next(model.parameters()).device
        if replay and self.device.type != "cuda":
            raise ValueError(
                f"CUDA graphs need the model on a CUDA device; it is on {self.device} (replay=False runs the "
                "same padded buckets without graphs)"
            )
        self.replay = replay
        self.buckets: dict[tuple, _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if replay else None
        self._stream = torch.cuda.Stream(self.device) if replay else None
        super().train(False)  # the model too: the graphs hold no dropout

    def train(self, mode: bool = True) -> CudaGraphModel:
        if mode:
            raise ValueError(
                "CudaGraphModel serves evaluation only: its graphs hold no dropout and no gradients"
            )
        return super().train(False)

    @torch.no_grad()
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Any:
        if self.model.training:
            raise ValueError("the wrapped model is in training mode: call model.eval() before serving it")
        self._check(input_ids, attention_mask, token_type_ids)
        lead, n = tuple(input_ids.shape[:-1]), input_ids.shape[-1]
        b, n_bucket, b_bucket = lead[0], bucket(n, self.lengths), bucket(lead[0], self.batch_sizes)
        if n_bucket is None or b_bucket is None:  # beyond the buckets: the model's own forward
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
        shape = (b_bucket, *lead[1:], n_bucket)
        # the model's GPU as the current device: its streams, the capture and the replays
        with torch.cuda.device(self.device) if self.replay else contextlib.nullcontext():
            entry = self._bucket(shape, token_type_ids is not None)
            entry.load(self.cfg.pad_token_id, input_ids, attention_mask, token_type_ids)
            if entry.graph is None:
                entry.output = self.model(**entry.inputs)
            else:
                entry.graph.replay()
        return _cut(entry.output, b * math.prod(lead[1:]), b, n, b_bucket)

    def _check(self, input_ids: Tensor, mask: Tensor | None, types: Tensor | None) -> None:
        """The model's own input checks, run here on the caller's tensors (the captured forward skips the range
        checks, which read the GPU), with the choices of a multiple-choice input folded into the batch."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() not in (2, 3):
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be (batch, length) or (batch, choices, length); got {shape}")
        for name, t in (("attention_mask", mask), ("token_type_ids", types)):
            if t is not None and tuple(t.shape) != tuple(input_ids.shape):
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}; CudaGraphModel takes it in the shape of input_ids, "
                    f"{tuple(input_ids.shape)} (2-D padding masks only)"
                )

        def rows(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.reshape(-1, t.shape[-1])

        check_inputs(self.cfg, rows(input_ids), None, rows(mask), rows(types), None)

    def _bucket(self, shape: tuple[int, ...], types: bool) -> _Bucket:
        """The bucket of input ``shape``, with ``token_type_ids`` if ``types``, under the current autocast
        setting: made, warmed up and captured at its first use."""
        amp = torch.is_autocast_enabled(self.device.type) and torch.get_autocast_dtype(self.device.type)
        key = (shape, types, amp)
        if key in self.buckets:
            return self.buckets[key]
        inputs = {
            "input_ids": torch.full(shape, self.cfg.pad_token_id, dtype=torch.long, device=self.device),
            "attention_mask": torch.ones(shape, dtype=torch.long, device=self.device),
        }
        if types:
            inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.long, device=self.device)
        entry = _Bucket(inputs)
        if self.replay:
            self._capture(entry)
        self.buckets[key] = entry
        return entry

    def _capture(self, entry: _Bucket) -> None:
        """Warm-up forwards on the side stream, then the capture. Autocast's cache of cast weights is off for
        both: a graph that read a cached cast would read memory freed when the caller's autocast region ends (the
        graph casts the weights itself instead, at every replay: a model converted to the 16-bit dtype spares
        that)."""
        kind = self.device.type
        amp = torch.autocast(
            kind,
            dtype=torch.get_autocast_dtype(kind),
            enabled=torch.is_autocast_enabled(kind),
            cache_enabled=False,
        )
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with amp, torch.cuda.stream(stream):
            for _ in range(WARMUP_FORWARDS):
                self.model(**entry.inputs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        entry.graph = torch.cuda.CUDAGraph()
        with amp, torch.cuda.graph(entry.graph, pool=self._pool, stream=stream):
            entry.output = self.model(**entry.inputs)


def _cut(out: Any, rows: int, batch: int, n: int, batch_bucket: int) -> Any:
    """A copy of the bucket's output ``out`` holding the real rows and tokens only: ``rows`` leading entries of
    fields with one per sequence (B·choices for a multiple-choice model's pooled states, else ``batch``), and the
    first ``n`` tokens of the per-token fields. Fields the wrapper does not compute (hidden states, attentions,
    the encoder's context) are None."""
    if isinstance(out, Tensor):
        raise TypeError("CudaGraphModel serves debertakit's models, whose outputs are output objects")
    per_token = _PER_TOKEN.get(type(out), ())
    changes = {}
    for f in fields(out):
        value = getattr(out, f.name)
        if not isinstance(value, Tensor):
            changes[f.name] = None
            continue
        lead = rows if value.shape[0] != batch_bucket else batch
        value = value[:lead]
        changes[f.name] = (value[:, :n] if f.name in per_token else value).clone()
    return replace(out, **changes)
