"""ONNX export equals PyTorch within 1e-4 on several batch sizes and lengths; torch.export likewise."""

from __future__ import annotations

import pytest
import torch

from debertakit import DebertaConfig, build_model, save_pretrained
from debertakit.export.onnx import check_onnx, export_onnx, export_program

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def _model(head: str, **kw):
    torch.manual_seed(0)
    return build_model(DebertaConfig.preset("tiny-v3", **kw), head).eval()


def test_onnx_sequence_classification_via_the_cli(tmp_path, capsys):
    from debertakit.cli import main

    model = _model("sequence_classification", num_labels=3)
    save_pretrained(model, tmp_path / "model")
    main(
        ["export", "--model", str(tmp_path / "model"), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]
    )
    printed = capsys.readouterr().out
    assert "OK" in printed and "1x5" in printed and "3x37" in printed
    check = check_onnx(tmp_path / "m.onnx", model)
    assert check.ok and check.max_abs_diff <= 1e-4
    # the check can fail: another model's weights are far from the file's outputs
    other = _model("sequence_classification", num_labels=3)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05)
    assert check_onnx(tmp_path / "m.onnx", other).max_abs_diff > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("head", ["question_answering", "token_classification", "multiple_choice"])
def test_onnx_other_heads(tmp_path, head):
    check = export_onnx(_model(head), tmp_path / f"{head}.onnx")
    assert check.ok


@pytest.mark.slow
def test_onnx_v1_layout(tmp_path):
    torch.manual_seed(0)
    model = build_model(DebertaConfig.preset("tiny-v1"), "sequence_classification").eval()
    assert export_onnx(model, tmp_path / "v1.onnx").ok


@pytest.mark.slow
def test_torch_export_program(tmp_path):
    check = export_program(_model("question_answering"), tmp_path / "qa.pt2")
    assert check.ok and (tmp_path / "qa.pt2").is_file()
