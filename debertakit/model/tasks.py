"""Backbone + one head, called like Hugging Face models: ``model(input_ids=..., attention_mask=..., labels=...)``.

Each class is the composition and nothing more: the backbone gives hidden states, the head gives logits, a
function from `debertakit.objectives` gives the loss when labels are passed.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from debertakit.config import DebertaConfig
from debertakit.model.backbone import DebertaModel, init_weights
from debertakit.model.heads import (
    EnhancedMaskDecoder,
    MaskedLMHead,
    QuestionAnsweringHead,
    ReplacedTokenDetectionHead,
    SequenceClassificationHead,
    TokenClassificationHead,
)
from debertakit.model.outputs import (
    BackboneOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
    SequenceOutput,
    TokenLogitsOutput,
)
from debertakit.objectives import (
    IGNORE_INDEX,
    masked_lm_loss,
    replaced_token_loss,
    sequence_loss,
    span_loss,
    token_loss,
)


class TaskModel(nn.Module):
    """Backbone (under the name ``deberta``) + a head. ``forward`` takes the backbone's inputs plus the head's
    targets and options; subclasses implement only ``head(out, **targets)``."""

    head_kind: str = "base"

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.cfg = cfg
        self.deberta = DebertaModel(cfg)

    def _init_head(self) -> None:
        for name, child in self.named_children():
            if name != "deberta":
                init_weights(child, self.cfg)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        cu_seqlens: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        causal: bool | None = None,
        **targets: Any,
    ):
        out = self.deberta(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cu_seqlens=cu_seqlens,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            causal=causal,
        )
        return self.head(out, **targets)

    def head(self, out: BackboneOutput, **targets: Any):
        return out


class DebertaBase(TaskModel):
    """The backbone alone, wrapped so that every model has its backbone under ``deberta``."""


class DebertaForMaskedLM(TaskModel):
    """MLM with the released head layout and, by default, the Enhanced Mask Decoder.

    With ``labels`` (B, N; -100 = not a target), only the labelled positions are decoded: ``logits`` is (M, V)
    for the M targets and ``labels`` in the output holds their labels. Pass ``decode_all=True`` for (B, N, V).
    ``use_emd`` overrides the configuration for one call.
    """

    head_kind = "masked_lm"

    def __init__(self, cfg: DebertaConfig):
        super().__init__(cfg)
        self.lm_head = MaskedLMHead(cfg)
        self.emd = EnhancedMaskDecoder(cfg) if not cfg.position_biased_input else None
        self._init_head()

    def head(
        self,
        out: BackboneOutput,
        labels: Tensor | None = None,
        use_emd: bool | None = None,
        decode_all: bool = False,
    ) -> MaskedLMOutput:
        use_emd = self.cfg.emd_enabled if use_emd is None else use_emd
        if use_emd and self.emd is None:
            raise ValueError(
                "use_emd=True needs position_biased_input=False (the EMD adds the absolute positions)"
            )
        select = (labels != IGNORE_INDEX) if (labels is not None and not decode_all) else None
        if use_emd:
            h = self.emd(self.deberta.encoder.layers[-1], out, select)  # (B, N, H) or (M, H)
        else:
            h = out.last_hidden_state if select is None else out.last_hidden_state[select]
        logits = self.lm_head(h, self.deberta.embeddings.word.weight)
        target = labels if select is None else labels[select]
        loss = masked_lm_loss(logits, target) if target is not None else None
        return MaskedLMOutput(
            logits, loss, target if select is not None else None, out.hidden_states, out.attentions
        )


class DebertaForReplacedTokenDetection(TaskModel):
    """The DeBERTa-v3 discriminator: one logit per token, "was this token replaced?" (``mask_predictions``)."""

    head_kind = "replaced_token_detection"

    def __init__(self, cfg: DebertaConfig):
        super().__init__(cfg)
        self.rtd_head = ReplacedTokenDetectionHead(cfg)
        self._init_head()

    def head(self, out: BackboneOutput, labels: Tensor | None = None) -> TokenLogitsOutput:
        logits = self.rtd_head(out.last_hidden_state)  # (B, N)
        loss = replaced_token_loss(logits, labels, out.context.token_mask) if labels is not None else None
        return TokenLogitsOutput(logits, loss, out.hidden_states, out.attentions)


class DebertaForSequenceClassification(TaskModel):
    """Classification (``num_labels`` > 1) or regression (``num_labels`` = 1) from the pooled first token."""

    head_kind = "sequence_classification"

    def __init__(self, cfg: DebertaConfig):
        super().__init__(cfg)
        self.classification_head = SequenceClassificationHead(cfg, cfg.num_labels)
        self._init_head()

    def head(self, out: BackboneOutput, labels: Tensor | None = None) -> SequenceOutput:
        logits, pooled = self.classification_head(out.last_hidden_state)
        loss = sequence_loss(logits, labels) if labels is not None else None
        return SequenceOutput(logits, loss, pooled, out.hidden_states, out.attentions)


class DebertaForTokenClassification(TaskModel):
    head_kind = "token_classification"

    def __init__(self, cfg: DebertaConfig):
        super().__init__(cfg)
        self.token_head = TokenClassificationHead(cfg, cfg.num_labels)
        self._init_head()

    def head(self, out: BackboneOutput, labels: Tensor | None = None) -> TokenLogitsOutput:
        logits = self.token_head(out.last_hidden_state)  # (B, N, C)
        loss = token_loss(logits, labels) if labels is not None else None
        return TokenLogitsOutput(logits, loss, out.hidden_states, out.attentions)


class DebertaForQuestionAnswering(TaskModel):
    head_kind = "question_answering"

    def __init__(self, cfg: DebertaConfig):
        super().__init__(cfg)
        self.qa_head = QuestionAnsweringHead(cfg)
        self._init_head()

    def head(
        self, out: BackboneOutput, start_positions: Tensor | None = None, end_positions: Tensor | None = None
    ) -> QuestionAnsweringOutput:
        start, end = self.qa_head(out.last_hidden_state)  # (B, N) each
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start, end, start_positions, end_positions, out.context.token_mask)
        return QuestionAnsweringOutput(start, end, loss, out.hidden_states, out.attentions)


class DebertaForMultipleChoice(TaskModel):
    """Inputs (B, choices, N); every choice is scored from its pooled first token; logits (B, choices)."""

    head_kind = "multiple_choice"

    def __init__(self, cfg: DebertaConfig):
        super().__init__(cfg)
        self.classification_head = SequenceClassificationHead(cfg, 1)
        self._init_head()

    def forward(self, input_ids: Tensor | None = None, inputs_embeds: Tensor | None = None, **kw: Any):
        first = input_ids if input_ids is not None else inputs_embeds
        if first is None or first.dim() < 3:
            raise ValueError("multiple choice expects inputs of shape (batch, choices, length)")
        b, c = first.shape[:2]

        def flat(t: Any) -> Any:  # (B, C, N, ...) -> (B*C, N, ...)
            return t.reshape(b * c, *t.shape[2:]) if isinstance(t, Tensor) and t.dim() >= 3 else t

        kw = {k: (v if k == "labels" else flat(v)) for k, v in kw.items()}
        return super().forward(
            input_ids=flat(input_ids), inputs_embeds=flat(inputs_embeds), n_choices=c, **kw
        )

    def head(self, out: BackboneOutput, n_choices: int, labels: Tensor | None = None) -> SequenceOutput:
        scores, pooled = self.classification_head(out.last_hidden_state)
        logits = scores.view(-1, n_choices)  # (B, choices)
        loss = sequence_loss(logits, labels) if labels is not None else None
        return SequenceOutput(logits, loss, pooled, out.hidden_states, out.attentions)


TASK_MODELS: dict[str, type[TaskModel]] = {
    cls.head_kind: cls
    for cls in (
        DebertaBase,
        DebertaForMaskedLM,
        DebertaForReplacedTokenDetection,
        DebertaForSequenceClassification,
        DebertaForTokenClassification,
        DebertaForQuestionAnswering,
        DebertaForMultipleChoice,
    )
}


def build_model(cfg: DebertaConfig, head: str = "base") -> TaskModel:
    """A randomly initialised model with the named head (see `TASK_MODELS`)."""
    if head not in TASK_MODELS:
        raise ValueError(f"unknown head {head!r}; expected one of {sorted(TASK_MODELS)}")
    return TASK_MODELS[head](cfg)
