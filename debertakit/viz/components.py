"""The score components of one layer of a model, recomputed from its own weights.

The backbone runs once (``output_hidden_states``, ``output_attentions``); the chosen layer's input is then
projected again with that layer's own query / key / position projections and passed to
`debertakit.attention.score_components`, the function the `eager` backend sums. Nothing in the model's forward
changes; the components therefore add up to the very scores the model used (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from debertakit.attention import score_components
from debertakit.model.layers import split_heads


@dataclass
class LayerScores:
    """Scores of one layer, (B, H, N, N) each, float32.

    Attributes:
        layer: the layer's index (0-based, counted from the first encoder layer).
        components: ``{"c2c": ..., "c2p": ..., "p2c": ..., "p2p": ...}``, only the terms the model has,
            each already multiplied by the layer's scale 1/sqrt(d·sf).
        scores: their sum, before masking.
        probs: the attention probabilities the model itself returned for this layer.
        allowed: (B|1, 1|H, N, N) bool visibility (padding, causal), or None when every pair is visible.
    """

    layer: int
    components: dict[str, Tensor]
    scores: Tensor
    probs: Tensor
    allowed: Tensor | None

    def softmax(self) -> Tensor:
        """The probabilities recomputed from the components (masked pairs get probability 0)."""
        s = self.scores
        if self.allowed is not None:
            s = s.masked_fill(~self.allowed, torch.finfo(s.dtype).min)
        p = torch.softmax(s, dim=-1)
        return p if self.allowed is None else p * self.allowed.any(-1, keepdim=True)


@torch.no_grad()
def layer_scores(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    layer: int = -1,
    causal: bool | None = None,
) -> LayerScores:
    """Score components of ``layer`` (negative counts from the end) for one batch.

    Args:
        model: a task model (its backbone is ``model.deberta``) or a `DebertaModel`.
        input_ids: (B, N) token ids.
        attention_mask: (B, N) padding mask or None.
        layer: encoder layer index; -1 is the last.
        causal: run the backbone with the triangular mask (default: the config's ``causal``).
    """
    backbone = getattr(model, "deberta", model)
    n_layers = len(backbone.encoder.layers)
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"layer {layer} out of range for a model with {n_layers} layers")
    index = layer % n_layers
    was_training = backbone.training
    backbone.eval()  # dropout off: the components must be the ones the probabilities came from
    try:
        out = backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            output_attentions=True,
            causal=causal,
        )
        ctx = out.context
        x = out.hidden_states[index]  # the layer's input, (B, N, H)
        att = backbone.encoder.layers[index].attention
        q = split_heads(att.query(x), att.n_heads)  # (B, H, N, D)
        k = split_heads(att.key(x), att.n_heads)  # (B, H, N, D)
        pos_q, pos_k = att.position_projections(ctx.rel_table, ctx.rel_index)  # (H, R, D) or None
    finally:
        backbone.train(was_training)
    parts = score_components(
        q, k, pos_q, pos_k, ctx.rel_index, ctx.geometry, scale=att.scale, terms=att.terms
    )
    n = input_ids.shape[1]
    return LayerScores(
        layer=index,
        components=parts,
        scores=sum(parts.values()),
        probs=out.attentions[index].float(),
        allowed=ctx.geometry.allowed(n, n, input_ids.device),
    )
