"""The DeBERTa model: backbone, heads, and task models composed from them."""

from debertakit.model.backbone import DebertaModel
from debertakit.model.tasks import (
    TASK_MODELS,
    DebertaBase,
    DebertaForMaskedLM,
    DebertaForMultipleChoice,
    DebertaForQuestionAnswering,
    DebertaForReplacedTokenDetection,
    DebertaForSequenceClassification,
    DebertaForTokenClassification,
    TaskModel,
    build_model,
)

__all__ = [
    "TASK_MODELS",
    "DebertaBase",
    "DebertaForMaskedLM",
    "DebertaForMultipleChoice",
    "DebertaForQuestionAnswering",
    "DebertaForReplacedTokenDetection",
    "DebertaForSequenceClassification",
    "DebertaForTokenClassification",
    "DebertaModel",
    "TaskModel",
    "build_model",
]
