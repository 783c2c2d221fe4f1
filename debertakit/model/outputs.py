"""Output objects: attribute access like Hugging Face's (``out.logits``), and ``out["logits"]`` too."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor


class _Output:
    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def keys(self) -> list[str]:
        return [
            f.name for f in fields(self) if getattr(self, f.name) is not None and not f.name.startswith("_")
        ]


@dataclass
class BackboneOutput(_Output):
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None  # embeddings, then every layer's output
    attentions: tuple[Tensor, ...] | None = None  # (B, H, N, N) per layer
    penultimate_hidden_state: Tensor | None = None  # the second-to-last layer's output (the EMD's keys)
    context: Any = None  # EncoderContext, for heads that run encoder layers again (EMD)


@dataclass
class MaskedLMOutput(_Output):
    logits: Tensor  # (B, N, V), or (M, V) for the M labelled positions when labels were given
    loss: Tensor | None = None
    labels: Tensor | None = None  # (M,) the labels of the decoded positions when only those were decoded
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class TokenLogitsOutput(_Output):
    """Per-token logits: token classification (B, N, C) and replaced-token detection (B, N)."""

    logits: Tensor
    loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class SequenceOutput(_Output):
    """Per-sequence logits: classification / regression (B, C) and multiple choice (B, choices)."""

    logits: Tensor
    loss: Tensor | None = None
    pooled: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class QuestionAnsweringOutput(_Output):
    start_logits: Tensor
    end_logits: Tensor
    loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
