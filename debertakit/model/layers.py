"""The building blocks of the DeBERTa backbone: embeddings, disentangled self-attention, the transformer layer
and the v2 convolution branch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from debertakit.attention import Geometry, PositionTerms, RelativeIndex, Request, get_backend, scale_for
from debertakit.attention.dropout import Dropout, dropout
from debertakit.attention.registry import device_capability
from debertakit.attention.relative import capturing_cuda_graph
from debertakit.config import DebertaConfig

_ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "tanh": torch.tanh,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
}


def activation(name: str):
    return _ACTIVATIONS[name]


class Embeddings(nn.Module):
    """word (+ absolute position) (+ token type) -> embed_proj (if embedding_size != hidden) -> LayerNorm -> mask."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        e, h = cfg.embedding_dim, cfg.hidden_size
        self.word = nn.Embedding(cfg.vocab_size, e, padding_idx=cfg.pad_token_id)
        self.position = nn.Embedding(cfg.max_position_embeddings, e) if cfg.position_biased_input else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size > 0 else None
        self.proj = nn.Linear(e, h, bias=False) if e != h else None
        self.norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout)

    def forward(
        self,
        input_ids: Tensor | None,
        inputs_embeds: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor,
        token_mask: Tensor | None,
    ) -> Tensor:
        x = self.word(input_ids) if inputs_embeds is None else inputs_embeds  # (B, N, E)
        if self.position is not None:
            x = x + self.position(position_ids)
        if self.token_type is not None and token_type_ids is not None:
            x = x + self.token_type(token_type_ids)
        if self.proj is not None:
            x = self.proj(x)  # (B, N, H)
        x = self.norm(x)
        if token_mask is not None:
            x = x * token_mask.unsqueeze(-1).to(x.dtype)  # padded positions start at zero
        return self.dropout(x)


def inference_cache_ok(module: nn.Module) -> bool:
    """Whether input-independent results (the relative table and its projections) may be reused across
    forward passes: evaluation without gradients, outside tracing (export and compiled graphs must compute
    them from the weights) and outside a CUDA graph's capture (a tensor made there lives in the graph's memory
    pool, which other graphs' replays write: kept in a cache past the capture, a later forward would read it
    overwritten; and a cached tensor read by the graph must stay alive as long as the graph, which a cache that
    keeps one entry does not promise: `debertakit.inference.graphs`)."""
    return (
        not module.training
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not capturing_cuda_graph()
    )


def tensor_state(t: Tensor | None) -> tuple:
    """What identifies a parameter's current values: storage, in-place version, dtype and device."""
    return () if t is None else (t.data_ptr(), version(t), t.dtype, t.device)


def version(t: Tensor) -> int | None:
    """The in-place version counter; None for tensors made under `torch.inference_mode`, which keep none (and
    cannot be changed in place outside it)."""
    return None if t.is_inference() else t._version


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(..., N, H*D) -> (..., H, N, D)"""
    *lead, n, hd = x.shape
    return x.view(*lead, n, n_heads, hd // n_heads).transpose(-3, -2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, N, D) -> (B, N, H*D)"""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


class DisentangledSelfAttention(nn.Module):
    """Projections of content and relative positions, then one call to the attention backend.

    Layouts (REFERENCE.md §2): v1 has no key bias, a bias-free position-key projection and a position-query
    projection with bias; v2/v3 have biases everywhere and, with ``share_att_key``, project the relative table
    with the content query/key projections.
    """

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        h, v1 = cfg.hidden_size, cfg.attention_layout == "v1"
        self.n_heads = cfg.num_heads
        self.terms = PositionTerms.from_config(cfg)
        self.scale = scale_for(cfg.head_dim, cfg.score_scale_factor)
        self.backend_name = cfg.attention_backend
        self.attention_dropout = cfg.attention_dropout
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h, bias=not v1)
        self.value = nn.Linear(h, h)
        self.out = nn.Linear(h, h)
        own_pos_proj = cfg.relative_attention and not cfg.share_att_key
        need_pos_k, need_pos_q = self.terms.c2p or self.terms.p2p, self.terms.p2c or self.terms.p2p
        self.pos_key = nn.Linear(h, h, bias=not v1) if own_pos_proj and need_pos_k else None
        self.pos_query = nn.Linear(h, h) if own_pos_proj and need_pos_q else None
        self.share_att_key = cfg.share_att_key
        self.pos_dropout = Dropout(cfg.hidden_dropout)
        self._pos_cache: tuple | None = None  # (key, table, (pos_q, pos_k)) at inference

    def position_projections(
        self, rel_table: Tensor | None, rel_index: RelativeIndex | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """(R, H*D) table window -> (H, R, D) position queries (p2c, p2p) and position keys (c2p, p2p)."""
        if rel_table is None or not self.terms.any:
            return None, None
        q_proj = self.query if self.share_att_key else self.pos_query
        k_proj = self.key if self.share_att_key else self.pos_key
        # at inference the projections depend only on the weights: computed once, reused while the table
        # (cached by the encoder) and the weights are unchanged; 2 of the 8 matmuls of a layer at N = 512
        key = None
        if inference_cache_ok(self):
            params = [p for proj in (q_proj, k_proj) if proj is not None for p in (proj.weight, proj.bias)]
            key = (id(rel_table), version(rel_table), rel_index.offset, *map(tensor_state, params))
            if self._pos_cache is not None and self._pos_cache[0] == key:
                return self._pos_cache[2]
        rel_table = self._table_dropout(rel_table, rel_index)
        pos_q = split_heads(q_proj(rel_table), self.n_heads) if (self.terms.p2c or self.terms.p2p) else None
        pos_k = split_heads(k_proj(rel_table), self.n_heads) if (self.terms.c2p or self.terms.p2p) else None
        self._pos_cache = None if key is None else (key, rel_table, (pos_q, pos_k))
        return pos_q, pos_k

    def _table_dropout(self, window: Tensor, rel_index: RelativeIndex) -> Tensor:
        """Dropout on the table window with the mask the *whole* table would draw, cut to the window. The
        window depends on the input length (compiled / exported code uses the whole table), so drawing for the
        whole table keeps the random stream, and so the training run, the same whichever window is used."""
        p = self.pos_dropout.p
        if not self.training or p == 0.0:
            return window
        full = torch.ones(rel_index.table_rows, window.shape[-1], device=window.device, dtype=window.dtype)
        mask = dropout(full, p)[rel_index.offset : rel_index.offset + window.shape[0]]
        return window * mask

    def forward(
        self,
        x: Tensor,
        geom: Geometry,
        rel_table: Tensor | None,
        rel_index: RelativeIndex | None,
        query_states: Tensor | None = None,
        return_probs: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, Nk, H) keys/values source; query_states: (B, Nq, H) or None (self-attention)."""
        q = split_heads(
            self.query(x if query_states is None else query_states), self.n_heads
        )  # (B, H, Nq, D)
        k = split_heads(self.key(x), self.n_heads)  # (B, H, Nk, D)
        v = split_heads(self.value(x), self.n_heads)  # (B, H, Nk, D)
        pos_q, pos_k = self.position_projections(rel_table, rel_index)  # (H, R, D) each, or None
        dropout_p = self.attention_dropout if self.training else 0.0
        backend = get_backend(self.backend_name, self._request(q, geom, return_probs, dropout_p))
        out, probs = backend.fn(
            q,
            k,
            v,
            pos_q,
            pos_k,
            rel_index,
            geom,
            scale=self.scale,
            terms=self.terms,
            dropout_p=dropout_p,
            return_probs=return_probs,
        )
        return self.out(merge_heads(out)), probs

    def _request(self, q: Tensor, geom: Geometry, return_probs: bool, dropout_p: float) -> Request:
        return Request(
            device_type=q.device.type,
            dtype=q.dtype,
            seq_len=q.shape[2],
            head_dim=q.shape[3],
            needs_probs=return_probs,
            dropout=dropout_p > 0.0,
            packed=geom.q_segments is not None,
            dense_mask=geom.dense is not None,
            causal=geom.causal,
            p2p=self.terms.p2p,
            grad=torch.is_grad_enabled() and q.requires_grad,
            capability=device_capability(q.device),
        )


class Layer(nn.Module):
    """attention -> residual + LayerNorm -> feed-forward -> residual + LayerNorm (post-norm, as released)."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        h = cfg.hidden_size
        self.attention = DisentangledSelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(h, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.act = activation(cfg.hidden_act)
        self.dropout = Dropout(cfg.hidden_dropout)

    def forward(
        self,
        x: Tensor,
        geom: Geometry,
        rel_table: Tensor | None,
        rel_index: RelativeIndex | None,
        query_states: Tensor | None = None,
        return_probs: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        residual = x if query_states is None else query_states
        a, probs = self.attention(x, geom, rel_table, rel_index, query_states, return_probs)
        h = self.attn_norm(residual + self.dropout(a))  # (B, Nq, H)
        f = self.ffn_out(self.act(self.ffn_in(h)))
        return self.ffn_norm(h + self.dropout(f)), probs


class ConvBranch(nn.Module):
    """DeBERTa-v2's convolution beside layer 0 (REFERENCE.md §2):
    h0 = LayerNorm(h0 + act(conv1d(embeddings with padding zeroed))) * mask."""

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        k = cfg.conv_kernel_size
        self.conv = nn.Conv1d(
            cfg.hidden_size, cfg.hidden_size, k, padding=(k - 1) // 2, groups=cfg.conv_groups
        )
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.act = activation(cfg.conv_act)
        self.dropout = Dropout(cfg.hidden_dropout)

    def forward(
        self, embedded: Tensor, layer0_out: Tensor, token_mask: Tensor | None, segments: Tensor | None = None
    ) -> Tensor:
        if segments is None:
            c = self.conv(embedded.transpose(1, 2)).transpose(1, 2)  # (B, N, H)
        else:
            c = self._segmented_conv(embedded, segments)
        if token_mask is not None:
            c = c * token_mask.unsqueeze(-1).to(c.dtype)
        out = self.norm(layer0_out + self.act(self.dropout(c)))
        if token_mask is not None:
            out = out * token_mask.unsqueeze(-1).to(out.dtype)
        return out

    def _segmented_conv(self, x: Tensor, segments: Tensor) -> Tensor:
        """The same convolution on a packed row, without mixing neighbouring sequences: each tap sees a
        neighbour only if it belongs to the same sequence (as if every sequence were zero-padded alone)."""
        k = self.conv.kernel_size[0]
        p = (k - 1) // 2
        xt = F.pad(x.transpose(1, 2), (p, p))  # (B, H, N + 2p)
        seg = F.pad(segments, (p, p), value=-2)  # (B, N + 2p)
        n = x.shape[1]
        out = self.conv.bias[None, :, None].to(x.dtype) if self.conv.bias is not None else 0
        for tap in range(k):
            same = (seg[:, tap : tap + n] == segments)[:, None].to(x.dtype)  # (B, 1, N)
            w = self.conv.weight[:, :, tap : tap + 1]  # (H, H/groups, 1)
            out = out + F.conv1d(xt[:, :, tap : tap + n] * same, w, groups=self.conv.groups)
        return out.transpose(1, 2)
