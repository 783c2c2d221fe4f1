"""Masked language modelling (DeBERTa v1/v2): the loss is computed on the selected positions only, decoded
through the Enhanced Mask Decoder (`DebertaForMaskedLM` decodes only the labelled positions)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from debertakit.model.tasks import DebertaForMaskedLM
from debertakit.objectives.losses import IGNORE_INDEX


def model_inputs(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The backbone inputs of a collated batch: padded (attention_mask) or packed (cu_seqlens)."""
    keys = ("attention_mask", "cu_seqlens")
    return {k: batch[k] for k in keys if k in batch}


class MaskedLMObjective(nn.Module):
    """MLM pretraining: ``forward(batch)`` -> ``{"loss", "mlm_loss", "mlm_accuracy", "mlm_targets"}``."""

    kind = "mlm"

    def __init__(self, model: DebertaForMaskedLM):
        super().__init__()
        self.model = model

    def forward(
        self, batch: dict[str, Tensor], generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        labels = batch["labels"]
        out = self.model(input_ids=batch["input_ids"], labels=labels, **model_inputs(batch))
        with torch.no_grad():
            correct = (out.logits.argmax(-1) == out.labels).float().sum()
            n = (labels != IGNORE_INDEX).sum()
        return {
            "loss": out.loss,
            "mlm_loss": out.loss.detach(),
            "mlm_accuracy": correct / n.clamp(min=1),
            "mlm_targets": n,
        }

    def parameter_groups(self) -> list[list[nn.Parameter]]:
        """One optimizer for the whole model."""
        return [list(self.model.parameters())]

    def export(self) -> dict[str, nn.Module]:
        """The models to save in Hugging Face form, by directory name."""
        return {"model": self.model}
