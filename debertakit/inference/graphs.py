"""CUDA graphs for serving: a model's forward recorded once per input-size bucket, then replayed.

At batch 1 an encoder's forward is set by the host, not the GPU: a v3-base forward of 128 tokens launches about
500 GPU kernels, 1.25 ms of GPU time on an H200, while the host's work of launching them (the Python of 12
layers) took 12 to 24 ms per forward (docs/gpu-kernel.md, "Measured on an H100 and an H200";
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
replaced by new tensors, ``model.to(...)`` say, are not, and the wrapper refuses to serve: wrap the model again),
and the objects the graph reads besides them (the relative index's lookup table on the GPU, which the model
keeps: `debertakit.model.backbone.Encoder.relative_table`). Inputs longer than the longest bucket, larger
batches, and buckets whose outputs are too large to keep (``max_output_bytes``) run the model's own forward.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from debertakit.model.backbone import check_inputs
from debertakit.model.heads import EnhancedMaskDecoder
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
    (the graphs hold no dropout), and the wrapper runs it under ``torch.no_grad``. Calls from several threads
    take turns (one bucket's buffers serve every call).

    Args:
        model: a debertakit model (`DebertaModel` or a task model) on a CUDA device.
        lengths: the length buckets, increasing. A model with absolute positions (at the input, or in the masked
            LM's Enhanced Mask Decoder) has them cut at ``max_position_embeddings``, its longest input.
        batch_sizes: the batch buckets, increasing.
        max_output_bytes: a bucket whose outputs are larger runs the model's own forward instead of a graph: a
            graph keeps its outputs' memory as long as it lives (a masked LM's logits over the vocabulary at 64
            rows of 512 tokens are 16.8 GB in float32).
        replay: False runs each bucket's padded forward directly, without a graph: the same inputs and outputs,
            on any device (how the padding is checked on a CPU).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        lengths: tuple[int, ...] = DEFAULT_LENGTHS,
        batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
        max_output_bytes: int = 2**30,
        replay: bool = True,
    ):
        super().__init__()
        self.model = model
        self.cfg = model.cfg
        self.lengths = _cap(_check_sizes("lengths", lengths), _longest_input(model))
        self.batch_sizes = _check_sizes("batch_sizes", batch_sizes)
        self.max_output_bytes = max_output_bytes
        self.device = next(model.parameters()).device
        if replay and self.device.type != "cuda":
            raise ValueError(
                f"CUDA graphs need the model on a CUDA device; it is on {self.device} (replay=False runs the "
                "same padded buckets without graphs)"
            )
        self.replay = replay
        self.buckets: dict[tuple, _Bucket | None] = {}  # None: the bucket runs the model's own forward
        self._pool = torch.cuda.graph_pool_handle() if replay else None
        self._stream = torch.cuda.Stream(self.device) if replay else None
        self._params = _parameter_memory(model)
        self._lock = threading.Lock()
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
        if _parameter_memory(self.model) != self._params:
            raise ValueError(
                "the model's parameters were replaced since the wrapper was made (model.to(...), say): the "
                "graphs read the old ones; wrap the model again"
            )
        self._check(input_ids, attention_mask, token_type_ids)
        lead, n = tuple(input_ids.shape[:-1]), input_ids.shape[-1]
        b, n_bucket, b_bucket = lead[0], bucket(n, self.lengths), bucket(lead[0], self.batch_sizes)
        shape = None if n_bucket is None or b_bucket is None else (b_bucket, *lead[1:], n_bucket)
        with self._lock:
            # the model's GPU as the current device: its streams, the capture and the replays
            with torch.cuda.device(self.device) if self.replay else contextlib.nullcontext():
                entry = None if shape is None else self._bucket(shape, token_type_ids is not None)
                if entry is not None:
                    entry.load(self.cfg.pad_token_id, input_ids, attention_mask, token_type_ids)
                    if entry.graph is None:
                        entry.output = self.model(**entry.inputs)
                    else:
                        entry.graph.replay()
                    return _cut(entry.output, b * math.prod(lead[1:]), b, n, b_bucket)
        # beyond the buckets, or outputs too large to keep: the model's own forward
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)

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

    def _bucket(self, shape: tuple[int, ...], types: bool) -> _Bucket | None:
        """The bucket of input ``shape``, with ``token_type_ids`` if ``types``, under the current autocast
        setting: made, warmed up and captured at its first use; None where its outputs are too large to keep."""
        amp = torch.is_autocast_enabled(self.device.type) and torch.get_autocast_dtype(self.device.type)
        key = (shape, types, amp)
        if key not in self.buckets:
            with torch.inference_mode(False):  # buffers that later calls outside inference mode may write
                inputs = {
                    "input_ids": torch.full(
                        shape, self.cfg.pad_token_id, dtype=torch.long, device=self.device
                    ),
                    "attention_mask": torch.ones(shape, dtype=torch.long, device=self.device),
                }
                if types:
                    inputs["token_type_ids"] = torch.zeros(shape, dtype=torch.long, device=self.device)
            entry = _Bucket(inputs)
            if _nbytes(self._warm_up(entry)) > self.max_output_bytes:
                entry = None
            elif self.replay:
                self._capture(entry)
            self.buckets[key] = entry
        return self.buckets[key]

    def _autocast(self) -> torch.autocast:
        """The caller's autocast setting with autocast's cache of cast weights off: a graph that read a cached
        cast would read memory freed when the caller's autocast region ends (the graph casts the weights itself
        instead, at every replay: a model converted to the 16-bit dtype spares that)."""
        kind = self.device.type
        return torch.autocast(
            kind,
            dtype=torch.get_autocast_dtype(kind),
            enabled=torch.is_autocast_enabled(kind),
            cache_enabled=False,
        )

    def _warm_up(self, entry: _Bucket) -> Any:
        """Forwards on the bucket's inputs before its capture (they compile the kernels and fill the caches that
        live across forwards), on a side stream; without replay, one. Returns the last one's output."""
        if not self.replay:
            return self.model(**entry.inputs)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with self._autocast(), torch.cuda.stream(stream):
            for _ in range(WARMUP_FORWARDS):
                out = self.model(**entry.inputs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return out

    def _capture(self, entry: _Bucket) -> None:
        entry.graph = torch.cuda.CUDAGraph()
        with self._autocast(), torch.cuda.graph(entry.graph, pool=self._pool, stream=self._stream):
            entry.output = self.model(**entry.inputs)


def _longest_input(model: nn.Module) -> int | None:
    """``max_position_embeddings`` where the model adds absolute positions (at the input, or in the masked LM's
    Enhanced Mask Decoder): positions past it have no embedding. None where every position is relative."""
    absolute = model.cfg.position_biased_input or any(
        isinstance(m, EnhancedMaskDecoder) for m in model.modules()
    )
    return model.cfg.max_position_embeddings if absolute else None


def _cap(lengths: tuple[int, ...], longest: int | None) -> tuple[int, ...]:
    """``lengths`` cut at ``longest``, which becomes the last bucket where a longer one was asked for."""
    if longest is None or lengths[-1] <= longest:
        return lengths
    return (*(n for n in lengths if n < longest), longest)


def _parameter_memory(model: nn.Module) -> tuple[int, ...]:
    """Where the parameters live: what a graph reads (changed by ``model.to(...)``, not by in-place updates)."""
    return tuple(p.data_ptr() for p in model.parameters())


def _nbytes(out: Any) -> int:
    """The bytes of an output object's tensors."""
    return sum(v.numel() * v.element_size() for v in vars(out).values() if isinstance(v, Tensor))


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
