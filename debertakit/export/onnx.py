"""Export to ONNX (dynamic batch and length) and to torch.export programs, each checked against PyTorch.

The exported graph is the model in inference mode with the `eager` attention backend (plain PyTorch ops) and
the whole relative-position table (no length-dependent window), so one graph serves every batch size and
length. `check_onnx` runs the file with onnxruntime on inputs of several shapes, with padding, and reports the
largest absolute difference from the PyTorch model.

Inputs: ``input_ids`` and ``attention_mask`` (int64; (batch, length), or (batch, choices, length) for multiple
choice). Outputs: ``logits`` (``start_logits`` and ``end_logits`` for QA; ``last_hidden_state`` for the bare
backbone).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

INPUT_NAMES = ("input_ids", "attention_mask")


class Exportable(nn.Module):
    """A task model as a function of (input_ids, attention_mask) returning plain tensors."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.kind = model.head_kind

    @property
    def output_names(self) -> list[str]:
        if self.kind == "question_answering":
            return ["start_logits", "end_logits"]
        if self.kind == "base":
            return ["last_hidden_state"]
        return ["logits"]

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        if self.kind == "question_answering":
            return out.start_logits, out.end_logits
        if self.kind == "base":
            return (out.last_hidden_state,)
        return (out.logits,)


@contextlib.contextmanager
def export_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Inference mode with the eager attention backend (restored afterwards)."""
    saved = [(m, m.backend_name) for m in model.modules() if hasattr(m, "backend_name")]
    was_training = model.training
    try:
        for m, _ in saved:
            m.backend_name = "eager"
        yield model.eval()
    finally:
        for m, name in saved:
            m.backend_name = name
        model.train(was_training)


def example_inputs(model: nn.Module, batch: int = 2, length: int = 11, choices: int = 3, seed: int = 0):
    """Random ids with the last row half padded: (batch, length), or (batch, choices, length)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, choices, length) if model.head_kind == "multiple_choice" else (batch, length)
    ids = torch.randint(5, model.cfg.vocab_size, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[-1, ..., max(1, length // 2) :] = 0
    ids = ids.masked_fill(mask == 0, model.cfg.pad_token_id)
    return ids, mask


def _dynamic_shapes(model: nn.Module, symbolic: bool):
    names = ("batch", "choices", "length") if model.head_kind == "multiple_choice" else ("batch", "length")
    if symbolic:
        dims = {n: torch.export.Dim(n) for n in names}
        axes = {i: dims[n] for i, n in enumerate(names)}
    else:
        axes = dict(enumerate(names))
    return {name: dict(axes) for name in INPUT_NAMES}


@dataclass
class ExportCheck:
    """Largest absolute difference between the exported model and PyTorch, per tested input shape."""

    path: str
    diffs: dict[str, float]
    tolerance: float

    @property
    def max_abs_diff(self) -> float:
        return max(self.diffs.values())

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def __str__(self) -> str:
        shapes = ", ".join(f"{k}: {v:.2e}" for k, v in self.diffs.items())
        verdict = "OK" if self.ok else "FAILED"
        return f"{self.path}: max |exported - PyTorch| = {self.max_abs_diff:.2e} ({shapes}); tolerance {self.tolerance:g}: {verdict}"


CHECK_SHAPES = ((1, 5), (2, 11), (3, 37))


def _reference(model: nn.Module, ids: Tensor, mask: Tensor) -> list[np.ndarray]:
    with torch.no_grad(), export_mode(model) as m:
        return [t.float().numpy() for t in Exportable(m)(ids, mask)]


def export_onnx(
    model: nn.Module, path: str | Path, *, opset: int = 18, check: bool = True, tolerance: float = 1e-4
):
    """Write an ONNX file with dynamic batch (and choices) and length; check it with onnxruntime.

    Args:
        model: a task model (any head) in float32.
        path: the .onnx file.
        opset: ONNX opset.
        check: run `check_onnx` afterwards.
        tolerance: largest absolute difference accepted by the check.

    Returns:
        The `ExportCheck`, or None without `check`.

    Raises:
        RuntimeError: the check found a difference above `tolerance`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with export_mode(model) as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = Exportable(m)
        program = torch.onnx.export(
            wrapped,
            example_inputs(m),
            input_names=list(INPUT_NAMES),
            output_names=wrapped.output_names,
            dynamic_shapes=_dynamic_shapes(m, symbolic=False),
            opset_version=opset,
            dynamo=True,
            verbose=False,
        )
        tmp = path.with_name(f".{path.name}.tmp")
        program.save(str(tmp))
        tmp.replace(path)
    if not check:
        return None
    result = check_onnx(path, model, tolerance=tolerance)
    if not result.ok:
        raise RuntimeError(str(result))
    return result


def check_onnx(path: str | Path, model: nn.Module, *, tolerance: float = 1e-4) -> ExportCheck:
    """Run the ONNX file with onnxruntime on several shapes (with padding) and compare with PyTorch."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diffs = {}
    for b, n in CHECK_SHAPES:
        ids, mask = example_inputs(model, b, n, seed=b * 100 + n)
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        ref = _reference(model, ids, mask)
        diffs["x".join(map(str, ids.shape))] = float(max(np.abs(g - r).max() for g, r in zip(got, ref)))
    return ExportCheck(str(path), diffs, tolerance)


def export_program(model: nn.Module, path: str | Path, *, check: bool = True, tolerance: float = 1e-4):
    """`torch.export` the model with dynamic batch and length, save it (`.pt2`) and check the saved program."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with export_mode(model) as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(
            Exportable(m), example_inputs(m), dynamic_shapes=_dynamic_shapes(m, symbolic=True)
        )
        tmp = path.with_name(f".{path.name}.tmp")
        torch.export.save(program, str(tmp))
        tmp.replace(path)
    if not check:
        return None
    loaded = torch.export.load(str(path)).module()
    diffs = {}
    for b, n in CHECK_SHAPES:
        ids, mask = example_inputs(model, b, n, seed=b * 100 + n)
        with torch.no_grad():
            got = [t.numpy() for t in loaded(ids, mask)]
        ref = _reference(model, ids, mask)
        diffs["x".join(map(str, ids.shape))] = float(max(np.abs(g - r).max() for g, r in zip(got, ref)))
    result = ExportCheck(str(path), diffs, tolerance)
    if not result.ok:
        raise RuntimeError(str(result))
    return result


def export(
    *,
    model: str,
    out: str,
    format: str = "onnx",
    head: str | None = None,
    opset: int = 18,
    tolerance: float = 1e-4,
) -> None:
    """Export a model directory to ONNX (dynamic batch and length) or a torch.export program, and check it.

    Prints the largest difference between the exported model and PyTorch on inputs of several shapes.

    Args:
        model: a Hugging Face-format DeBERTa directory (e.g. `best/` of a fine-tuning run).
        out: the output file (.onnx, or .pt2 for format torch).
        format: "onnx" (checked with onnxruntime) or "torch" (torch.export, checked after reloading).
        head: which head to export (default: the checkpoint's own).
        opset: ONNX opset version.
        tolerance: largest absolute difference accepted by the check.
    """
    from debertakit.convert.checkpoint import load_pretrained

    if format not in ("onnx", "torch"):
        raise ValueError(f"format {format!r}; expected 'onnx' or 'torch'")
    m = load_pretrained(model, head, dtype=torch.float32)
    if format == "onnx":
        result = export_onnx(m, out, opset=opset, tolerance=tolerance)
    else:
        result = export_program(m, out, tolerance=tolerance)
    print(result)
