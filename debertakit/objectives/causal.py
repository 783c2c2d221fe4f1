"""Causal language modelling with a DeBERTa encoder, and the DeBERTa-MT joint objective (paper §5, NLG).

* **Causal LM.** The backbone runs with the triangular mask (``causal=True``: no token sees a later one) and the
  masked-LM head predicts the *next* token at every position: the hidden state of token i gives the
  distribution of token i + 1. The head is the released ``lm_predictions.lm_head`` layout (tied to the word
  embeddings), decoded through the Enhanced Mask Decoder when the model has it (under the same triangular
  mask, so the decoder cannot look ahead either).
* **DeBERTa-MT** trains MLM and autoregressive LM jointly with shared weights, as UniLM does. Two schedules:
  ``"alternate"`` takes an MLM step on even steps and an LM step on odd ones (each step sees one objective, as
  UniLM alternates its objectives over batches); ``"mix"`` adds both losses on every batch
  (``mlm + lm_weight · lm``).
* **Perplexity** of a text (`perplexity`): the token stream is cut into windows of at most ``window`` tokens,
  each starting with [CLS]; consecutive windows overlap so that every token after the first window is predicted
  with at least ``window - stride`` tokens of context, and every token is scored exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from debertakit.objectives.losses import IGNORE_INDEX, masked_lm_loss

MTSchedule = Literal["alternate", "mix"]


def next_token_labels(
    input_ids: Tensor, attention_mask: Tensor | None = None, cu_seqlens: Tensor | None = None
) -> Tensor:
    """(B, N) labels: ``labels[:, i] = input_ids[:, i + 1]``; the last position and padding are ignored (-100),
    and so is the last token of every sequence of a packed row (``cu_seqlens``: its successor is another
    document)."""
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = input_ids[:, 1:]
    if attention_mask is not None:
        nxt = torch.zeros_like(attention_mask, dtype=torch.bool)
        nxt[:, :-1] = attention_mask[:, 1:].bool()
        labels = labels.masked_fill(~(nxt & attention_mask.bool()), IGNORE_INDEX)
    if cu_seqlens is not None:
        ends = cu_seqlens[1:].long() - 1
        labels[0, ends[ends < labels.shape[1]]] = IGNORE_INDEX
        labels[0, int(cu_seqlens[-1]) :] = IGNORE_INDEX
    return labels


def causal_lm_logits(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    select: Tensor | None = None,
    use_emd: bool | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Next-token logits of a masked-LM model run with the triangular mask.

    Args:
        model: a `DebertaForMaskedLM`.
        input_ids: (B, N) token ids.
        attention_mask: (B, N) padding mask or None.
        select: (B, N) bool positions to decode (their logits are returned in row-major order) or None (all).
        use_emd: decode through the Enhanced Mask Decoder (default: the model's configuration).
        cu_seqlens: packed rows (see `DebertaModel`).

    Returns:
        (B, N, V) logits, or (M, V) for the M selected positions. Row i predicts token i + 1.
    """
    out = model.deberta(
        input_ids=input_ids, attention_mask=attention_mask, cu_seqlens=cu_seqlens, causal=True
    )
    use_emd = model.cfg.emd_enabled if use_emd is None else use_emd
    if use_emd:
        if model.emd is None:
            raise ValueError(
                "use_emd=True needs a model with an Enhanced Mask Decoder (position_biased_input=False)"
            )
        h = model.emd(model.deberta.encoder.layers[-1], out, select)  # (B, N, H) or (M, H)
    else:
        h = out.last_hidden_state if select is None else out.last_hidden_state[select]
    return model.lm_head(h, model.deberta.embeddings.word.weight)


def causal_lm_loss(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    use_emd: bool | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Mean next-token cross-entropy over the real tokens that have a successor.

    Returns:
        The loss and ``{"lm_loss": ..., "lm_accuracy": ..., "lm_tokens": ...}`` for logging.
    """
    labels = next_token_labels(input_ids, attention_mask)
    select = labels != IGNORE_INDEX
    if not bool(select.any()):
        raise ValueError(
            f"no next-token targets in a batch of shape {tuple(input_ids.shape)}: sequences need >= 2 tokens"
        )
    logits = causal_lm_logits(model, input_ids, attention_mask, select=select, use_emd=use_emd)  # (M, V)
    target = labels[select]
    loss = masked_lm_loss(logits, target)
    acc = (logits.argmax(-1) == target).float().mean()
    return loss, {
        "lm_loss": float(loss.detach()),
        "lm_accuracy": float(acc),
        "lm_tokens": int(target.numel()),
    }


def mlm_loss(model: torch.nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
    """Masked-LM loss of a batch already masked (``input_ids``, ``attention_mask``, ``labels`` with -100)."""
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), labels=batch["labels"]
    )
    acc = (
        (out.logits.argmax(-1) == out.labels).float().mean()
        if out.labels is not None
        else torch.tensor(math.nan)
    )
    return out.loss, {"mlm_loss": float(out.loss.detach()), "mlm_accuracy": float(acc)}


def mt_loss(
    model: torch.nn.Module,
    mlm_batch: Mapping[str, Tensor],
    lm_batch: Mapping[str, Tensor],
    step: int,
    *,
    schedule: MTSchedule = "alternate",
    lm_weight: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """The DeBERTa-MT objective: MLM and causal LM on shared weights (UniLM style).

    Args:
        model: a `DebertaForMaskedLM`.
        mlm_batch: a masked batch (``input_ids``, ``attention_mask``, ``labels``).
        lm_batch: an unmasked batch (``input_ids``, ``attention_mask``) for next-token prediction; usually the
            same text as ``mlm_batch`` before masking.
        step: the optimizer step (``"alternate"``: even steps MLM, odd steps LM).
        schedule: ``"alternate"`` or ``"mix"`` (both losses every step).
        lm_weight: weight of the LM loss in ``"mix"``.
    """
    if schedule == "alternate":
        if step % 2 == 0:
            return mlm_loss(model, mlm_batch)
        return causal_lm_loss(model, lm_batch["input_ids"], lm_batch.get("attention_mask"))
    if schedule == "mix":
        a, ma = mlm_loss(model, mlm_batch)
        b, mb = causal_lm_loss(model, lm_batch["input_ids"], lm_batch.get("attention_mask"))
        return a + lm_weight * b, {**ma, **mb}
    raise ValueError(f"unknown DeBERTa-MT schedule {schedule!r}; expected 'alternate' or 'mix'")


# ---------------------------------------------------------------------------------------------------- training objectives
class CausalLMObjective(nn.Module):
    """Causal LM pretraining on the pretraining loop's batches: the unmasked rows (``original_ids``) with the
    triangular mask. ``forward(batch)`` -> ``{"loss", "lm_loss", "lm_accuracy", "lm_targets"}``."""

    kind = "causal"

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def lm(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        ids = batch.get("original_ids", batch["input_ids"])
        labels = next_token_labels(ids, batch.get("attention_mask"), batch.get("cu_seqlens"))
        select = labels != IGNORE_INDEX
        logits = causal_lm_logits(
            self.model, ids, batch.get("attention_mask"), select=select, cu_seqlens=batch.get("cu_seqlens")
        )
        target = labels[select]
        loss = masked_lm_loss(logits, target)
        with torch.no_grad():
            acc = (logits.argmax(-1) == target).float().mean()
        return {"loss": loss, "lm_loss": loss.detach(), "lm_accuracy": acc, "lm_targets": select.sum()}

    def forward(
        self, batch: Mapping[str, Tensor], generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        return self.lm(batch)

    def parameter_groups(self) -> list[list[nn.Parameter]]:
        return [list(self.model.parameters())]

    def export(self) -> dict[str, nn.Module]:
        return {"model": self.model}


class MTObjective(CausalLMObjective):
    """DeBERTa-MT on the pretraining loop's batches: MLM on the masked rows, causal LM on the same rows
    unmasked, shared weights (UniLM style).

    ``"alternate"``: training forwards alternate MLM, LM, MLM, ... (a counter kept in the state dict, so that a
    resumed run continues the same sequence); one objective per forward, so a step costs what an MLM step
    costs. ``"mix"``: ``mlm + lm_weight · lm`` on every batch. In evaluation both are computed and reported.
    Training log lines report only the combined ``loss``.
    """

    kind = "mt"

    def __init__(self, model: nn.Module, schedule: MTSchedule = "alternate", lm_weight: float = 1.0):
        super().__init__(model)
        if schedule not in ("alternate", "mix"):
            raise ValueError(f"unknown DeBERTa-MT schedule {schedule!r}; expected 'alternate' or 'mix'")
        self.schedule, self.lm_weight = schedule, lm_weight
        self.register_buffer("forwards", torch.zeros((), dtype=torch.long))

    def mlm(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        from debertakit.objectives.mlm import model_inputs

        labels = batch["labels"]
        out = self.model(input_ids=batch["input_ids"], labels=labels, **model_inputs(batch))
        n = (labels != IGNORE_INDEX).sum()
        with torch.no_grad():
            acc = (out.logits.argmax(-1) == out.labels).float().sum() / n.clamp(min=1)
        return {"loss": out.loss, "mlm_loss": out.loss.detach(), "mlm_accuracy": acc, "mlm_targets": n}

    def forward(
        self, batch: Mapping[str, Tensor], generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        if not self.training:
            a, b = self.mlm(batch), self.lm(batch)
            return {**a, **b, "loss": a["loss"] + self.lm_weight * b["loss"]}
        if self.schedule == "mix":
            a, b = self.mlm(batch), self.lm(batch)
            return {"loss": a["loss"] + self.lm_weight * b["loss"]}
        use_lm = int(self.forwards) % 2 == 1
        self.forwards += 1
        return {"loss": (self.lm(batch) if use_lm else self.mlm(batch))["loss"]}


# ---------------------------------------------------------------------------------------------------- perplexity
@dataclass
class Perplexity:
    """Result of `perplexity`: ``ppl = exp(nll / tokens)``."""

    ppl: float
    nll: float  # summed negative log-likelihood (nats)
    tokens: int  # tokens scored
    windows: int

    def to_dict(self) -> dict[str, float]:
        return {
            "perplexity": self.ppl,
            "nll_per_token": self.nll / max(self.tokens, 1),
            "tokens": self.tokens,
            "windows": self.windows,
        }


def sliding_windows(n_tokens: int, window: int, stride: int) -> Iterable[tuple[int, int, int]]:
    """(begin, end, first_scored) over a stream of ``n_tokens`` text tokens, windows of ``window`` text tokens.

    Token t is scored in the window where ``first_scored <= t < end``; each token is scored exactly once.
    Token 0 is predicted from [CLS] alone.
    """
    if window < 1 or not 1 <= stride <= window:
        raise ValueError(
            f"window={window} and stride={stride}: expected window >= 1 and 1 <= stride <= window"
        )
    begin, scored_to = 0, 0
    while scored_to < n_tokens:
        end = min(begin + window, n_tokens)
        yield begin, end, scored_to
        scored_to = end
        begin = min(begin + stride, max(n_tokens - window, 0)) if end < n_tokens else end


@torch.no_grad()
def perplexity(
    model: torch.nn.Module,
    token_ids: Tensor | list[int],
    *,
    cls_token_id: int,
    window: int = 128,
    stride: int | None = None,
    batch_size: int = 8,
    use_emd: bool | None = None,
) -> Perplexity:
    """Perplexity of a causal / DeBERTa-MT model on a token stream (sliding windows, see the module docstring).

    Args:
        model: a `DebertaForMaskedLM` trained with the causal or MT objective.
        token_ids: the text's token ids, without special tokens.
        cls_token_id: id prepended to every window.
        window: text tokens per window (the model sees ``window + 1`` with [CLS]).
        stride: how far each window moves (default ``window // 2``).
        batch_size: windows per forward pass.
        use_emd: see `causal_lm_logits`.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    if ids.numel() == 0:
        raise ValueError("perplexity of an empty text: no tokens to score")
    stride = stride or max(window // 2, 1)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll, count, n_windows = 0.0, 0, 0
    spans = list(sliding_windows(ids.numel(), window, stride))
    try:
        for i in range(0, len(spans), batch_size):
            chunk = spans[i : i + batch_size]
            width = max(end - begin for begin, end, _ in chunk) + 1
            inp = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros_like(inp)
            labels = torch.full_like(inp, IGNORE_INDEX)
            for r, (begin, end, first) in enumerate(chunk):
                n = end - begin
                inp[r, 0] = cls_token_id
                inp[r, 1 : n + 1] = ids[begin:end]
                mask[r, : n + 1] = 1
                # row position p predicts input position p + 1, i.e. text token begin + p
                lo = first - begin
                labels[r, lo:n] = ids[first:end]
            inp, mask, labels = inp.to(device), mask.to(device), labels.to(device)
            select = labels != IGNORE_INDEX
            logits = causal_lm_logits(model, inp, mask, select=select, use_emd=use_emd)
            nll += float(torch.nn.functional.cross_entropy(logits.float(), labels[select], reduction="sum"))
            count += int(select.sum())
            n_windows += len(chunk)
    finally:
        model.train(was_training)
    return Perplexity(math.exp(nll / count), nll, count, n_windows)
