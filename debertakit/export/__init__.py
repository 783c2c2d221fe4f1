"""Export: ONNX (checked with onnxruntime) and torch.export programs."""

from debertakit.export.onnx import ExportCheck, check_onnx, export_onnx, export_program

__all__ = ["ExportCheck", "check_onnx", "export_onnx", "export_program"]
