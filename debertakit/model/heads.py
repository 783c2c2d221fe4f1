"""Small heads on top of the backbone's hidden states. Each is a few lines; losses live in `debertakit.objectives`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from debertakit.attention import Geometry
from debertakit.attention.dropout import Dropout
from debertakit.config import DebertaConfig
from debertakit.model.layers import Layer, activation
from debertakit.model.outputs import BackboneOutput


class MaskedLMHead(nn.Module):
    """The released checkpoints' MLM head, ``lm_predictions.lm_head`` (REFERENCE.md §2):
    logits = LayerNorm(act(dense(h))) @ word_embeddingᵀ + bias."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_dim)
        self.act = activation(cfg.hidden_act)
        self.norm = nn.LayerNorm(cfg.embedding_dim, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        """h: (..., H), word_embeddings: (V, E) -> (..., V)"""
        return self.norm(self.act(self.dense(h))) @ word_embeddings.t() + self.bias


class EnhancedMaskDecoder(nn.Module):
    """EMD (paper §3.2; REFERENCE.md §1–2), as the official repository runs it: absolute positions enter only
    here. Two passes of the *last* encoder layer's weights: keys/values are the second-to-last layer's output
    H; the first query is H + P (absolute position embedding), the second query is the first pass's output.

    Only the selected positions (the masked ones, when labels are given) are decoded: a query row depends only
    on its own state, so decoding a subset of rows is exact and cheap.
    """

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.passes = 2

    def forward(self, last_layer: Layer, out: BackboneOutput, select: Tensor | None = None) -> Tensor:
        """Returns (B, N, H) decoder states, or (M, H) for the M selected positions (row-major order)."""
        ctx = out.context
        kv = out.penultimate_hidden_state  # (B, N, H)
        positions = ctx.positions.expand(kv.shape[:2])  # (B, N) absolute positions
        geom = ctx.geometry
        if select is not None:
            rows, valid = _selected_rows(select)  # (B, M)
            query = torch.gather(kv, 1, rows[..., None].expand(-1, -1, kv.shape[-1]))  # (B, M, H)
            positions = torch.gather(positions, 1, rows)
            geom = _query_subset(geom, rows, kv.shape[1])
        else:
            query = kv
        query = query + self.position_embeddings(positions)
        for _ in range(self.passes):
            query, _ = last_layer(kv, geom, ctx.rel_table, ctx.rel_index, query_states=query)
        return query[valid] if select is not None else query


def _selected_rows(select: Tensor) -> tuple[Tensor, Tensor]:
    """(B, N) bool -> (B, M) indices of the selected positions (left-aligned, padded) and their validity."""
    counts = select.sum(1)
    m = max(int(counts.max()), 1)
    order = torch.argsort((~select).to(torch.int8), dim=1, stable=True)[:, :m]
    valid = torch.arange(m, device=select.device)[None] < counts[:, None]
    return order, valid


def _query_subset(geom: Geometry, rows: Tensor, n: int) -> Geometry:
    """The geometry of queries at ``rows`` (B, M) against all n keys."""
    qp = geom.q_positions if geom.q_positions is not None else torch.arange(n, device=rows.device)[None]
    kp = geom.k_positions if geom.k_positions is not None else torch.arange(n, device=rows.device)[None]
    dense = None
    if geom.dense is not None:
        idx = rows[:, None, :, None].expand(-1, geom.dense.shape[1], -1, geom.dense.shape[-1])
        dense = torch.gather(geom.dense, 2, idx)
    return Geometry(
        key_mask=geom.key_mask,
        q_segments=None
        if geom.q_segments is None
        else torch.gather(geom.q_segments.expand(rows.shape[0], -1), 1, rows),
        k_segments=geom.k_segments,
        q_positions=torch.gather(qp.expand(rows.shape[0], -1), 1, rows),
        k_positions=kp,
        dense=dense,
        causal=geom.causal,
        max_seqlen=geom.max_seqlen,
    )


class ReplacedTokenDetectionHead(nn.Module):
    """The official RTD discriminator head, ``mask_predictions`` (REFERENCE.md §2):
    logit = Linear(act(dense(LayerNorm(h + h_CLS)))) -> (B, N)."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.classifier = nn.Linear(cfg.hidden_size, 1)

    def forward(self, h: Tensor) -> Tensor:
        h = self.norm(h + h[:, :1])  # every token sees the [CLS] state
        return self.classifier(self.act(self.dense(h))).squeeze(-1)


class Pooler(nn.Module):
    """The first token's state -> dropout -> dense -> act (``ContextPooler`` of the released code)."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.dropout = Dropout(cfg.pooler_dropout)
        self.dense = nn.Linear(cfg.hidden_size, cfg.pooler_dim)
        self.act = activation(cfg.pooler_hidden_act)

    def forward(self, h: Tensor) -> Tensor:
        return self.act(self.dense(self.dropout(h[:, 0])))  # (B, P)


class SequenceClassificationHead(nn.Module):
    """Pooler -> dropout -> Linear(num_labels); num_labels = 1 is regression. With ``num_labels=1`` and one
    output per sequence it is also the multiple-choice scorer."""

    def __init__(self, cfg: DebertaConfig, num_labels: int):
        super().__init__()
        self.pooler = Pooler(cfg)
        self.dropout = Dropout(cfg.hidden_dropout if cfg.cls_dropout is None else cfg.cls_dropout)
        self.classifier = nn.Linear(cfg.pooler_dim, num_labels)

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        pooled = self.pooler(h)
        return self.classifier(self.dropout(pooled)), pooled


class TokenClassificationHead(nn.Module):
    def __init__(self, cfg: DebertaConfig, num_labels: int):
        super().__init__()
        self.dropout = Dropout(cfg.hidden_dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)

    def forward(self, h: Tensor) -> Tensor:
        return self.classifier(self.dropout(h))  # (B, N, C)


class QuestionAnsweringHead(nn.Module):
    """Start and end logits per token (``qa_outputs``)."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self.qa_outputs(h).unbind(-1)
        return start.contiguous(), end.contiguous()  # (B, N) each
