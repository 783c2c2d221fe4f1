"""The DeBERTa backbone: embeddings -> encoder layers (disentangled attention) -> hidden states.

Heads and objectives live elsewhere (`debertakit.model.heads`, `debertakit.objectives`); the backbone only
returns hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from debertakit.attention import Geometry, RelativeIndex
from debertakit.attention.geometry import packed_geometry, validate_cu_seqlens
from debertakit.attention.relative import capturing_cuda_graph
from debertakit.config import DebertaConfig
from debertakit.model.layers import ConvBranch, Embeddings, Layer, inference_cache_ok, tensor_state
from debertakit.model.outputs import BackboneOutput


@dataclass
class EncoderContext:
    """What a later pass over the encoder's layers (the Enhanced Mask Decoder) needs from this forward."""

    geometry: Geometry
    rel_table: Tensor | None  # (R, H) the window of the (normalised) relative table
    rel_index: RelativeIndex | None
    token_mask: Tensor | None  # (B, N) bool
    positions: Tensor  # (B|1, N) int64 position of each token inside its sequence


class Encoder(nn.Module):
    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.rel_embeddings = (
            nn.Embedding(2 * cfg.rel_span, cfg.hidden_size) if cfg.relative_attention else None
        )
        self.rel_norm = (
            nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
            if cfg.relative_attention and cfg.norm_rel_ebd == "layer_norm"
            else None
        )
        self.conv = ConvBranch(cfg) if cfg.conv_kernel_size > 0 else None
        self.rel_index = RelativeIndex.from_config(cfg) if cfg.relative_attention else None
        self.gradient_checkpointing = cfg.gradient_checkpointing
        self._table_cache: tuple | None = None  # (key, (table window, index)) at inference
        # the index of each window start used so far, kept as long as the model: a captured CUDA graph reads the
        # index's lookup table on the GPU (`RelativeIndex.lut_on`) at every replay, and the process-wide cache
        # the instances come from evicts its oldest entries (`relative._relative_index`)
        self._shifted: dict[int, RelativeIndex] = {}

    def relative_table(self, max_distance: int) -> tuple[Tensor | None, RelativeIndex | None]:
        """The (normalised) relative table, cut to the rows that distances up to ``max_distance`` use."""
        if self.rel_embeddings is None:
            return None, None
        if torch.compiler.is_compiling():
            # torch.compile / torch.export (ONNX): the whole table; the window depends on the input length,
            # which is symbolic there (using all rows gives the same result)
            lo, hi = 0, self.rel_index.table_rows
        else:
            lo, hi = self.rel_index.window(max_distance)
        # at inference the window depends only on the weights: the same tensor is returned while they are
        # unchanged, so the layers can reuse its projections (`DisentangledSelfAttention.position_projections`)
        key = None
        if inference_cache_ok(self):
            norm = [] if self.rel_norm is None else [self.rel_norm.weight, self.rel_norm.bias]
            key = (lo, hi, *map(tensor_state, [self.rel_embeddings.weight, *norm]))
            if self._table_cache is not None and self._table_cache[0] == key:
                return self._table_cache[1]
        table = self.rel_embeddings.weight
        if self.rel_norm is not None:
            table = self.rel_norm(table[lo:hi])  # LayerNorm is per row: normalising the window is exact
        else:
            table = table[lo:hi]
        if lo not in self._shifted:
            self._shifted[lo] = self.rel_index.shifted(lo)
        result = table, self._shifted[lo]
        self._table_cache = None if key is None else (key, result)
        return result

    def forward(
        self,
        x: Tensor,
        ctx: EncoderContext,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """x: (B, N, H) embeddings. Returns the last hidden state, all hidden states (embeddings first, when
        asked; the second-to-last is always kept for the EMD) and attention probabilities (when asked)."""
        hidden, attentions = [x], []
        embedded = x
        for i, layer in enumerate(self.layers):
            if self.gradient_checkpointing and self.training:
                x, probs = checkpoint(
                    layer,
                    x,
                    ctx.geometry,
                    ctx.rel_table,
                    ctx.rel_index,
                    None,
                    output_attentions,
                    use_reentrant=False,
                )
            else:
                x, probs = layer(
                    x, ctx.geometry, ctx.rel_table, ctx.rel_index, return_probs=output_attentions
                )
            if i == 0 and self.conv is not None:
                x = self.conv(embedded, x, ctx.token_mask, ctx.geometry.q_segments)
            hidden.append(x)
            if output_attentions:
                attentions.append(probs)
        return x, hidden, attentions


class DebertaModel(nn.Module):
    """The backbone. Called like Hugging Face's ``DebertaV2Model``:

    ``model(input_ids=..., attention_mask=..., token_type_ids=...)`` -> `BackboneOutput` with
    ``last_hidden_state`` (B, N, H) and, when asked, ``hidden_states`` / ``attentions``.

    Padding-free batches: pass one row of concatenated sequences, ``input_ids`` (1, T), with
    ``cu_seqlens = [0, n0, n0 + n1, ...]``; relative positions restart in each sequence and no token attends
    across sequences.
    """

    def __init__(self, cfg: DebertaConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        init_weights(self, cfg)

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
    ) -> BackboneOutput:
        shape, device = check_inputs(
            self.cfg, input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids
        )
        causal = self.cfg.causal if causal is None else causal
        ctx = self.context(shape, device, attention_mask, cu_seqlens, causal)
        if position_ids is None:
            position_ids = ctx.positions.expand(shape)
        ctx.positions = position_ids  # absolute positions, also what the EMD adds
        x = self.embeddings(
            input_ids, inputs_embeds, token_type_ids, position_ids, ctx.token_mask
        )  # (B, N, H)
        last, hidden, attentions = self.encoder(x, ctx, output_hidden_states, output_attentions)
        return BackboneOutput(
            last_hidden_state=last,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            penultimate_hidden_state=hidden[-2],
            context=ctx,
        )

    def context(
        self,
        shape: tuple[int, int],
        device: torch.device,
        attention_mask: Tensor | None,
        cu_seqlens: Tensor | None,
        causal: bool,
    ) -> EncoderContext:
        b, n = shape
        if cu_seqlens is not None:
            if b != 1:
                raise ValueError(
                    f"a packed batch (cu_seqlens given) is one row of shape (1, T); got batch size {b}"
                )
            validate_cu_seqlens(cu_seqlens, n)
            geom, positions = packed_geometry(cu_seqlens.to(device), n, causal)
            token_mask = geom.key_mask
            if attention_mask is not None:
                if attention_mask.dim() != 2:
                    raise ValueError("with cu_seqlens, attention_mask must be 2-D (1, T) or None")
                token_mask = token_mask & attention_mask.bool()
                geom.key_mask = token_mask
        else:
            geom, token_mask = geometry_from_mask(attention_mask, causal)
            positions = torch.arange(n, device=device)[None]
        table, index = self.encoder.relative_table(geom.max_distance(n, n))
        return EncoderContext(geom, table, index, token_mask, positions)


def geometry_from_mask(attention_mask: Tensor | None, causal: bool) -> tuple[Geometry, Tensor | None]:
    """2-D padding masks (B, N), explicit 3-D (B, N, N) and 4-D (B, 1|H, N, N) masks -> Geometry + token mask."""
    if attention_mask is None:
        return Geometry(causal=causal), None
    if attention_mask.dim() == 2:
        token_mask = attention_mask.bool()
        return Geometry(key_mask=token_mask, causal=causal), token_mask
    dense = attention_mask.bool()
    if dense.dim() == 3:
        dense = dense[:, None]
    # a token is real if anyone may attend to it (REFERENCE.md §2, as the released code derives it)
    token_mask = dense.any(1).any(-2)
    return Geometry(dense=dense, causal=causal), token_mask


def check_inputs(
    cfg: DebertaConfig,
    input_ids: Tensor | None,
    inputs_embeds: Tensor | None,
    attention_mask: Tensor | None,
    token_type_ids: Tensor | None,
    position_ids: Tensor | None,
) -> tuple[tuple[int, int], torch.device]:
    """Raise a ValueError naming the bad value before any heavy work runs. The value ranges (token ids, ...)
    are read on the host, which waits for the GPU: not under ``torch.compile``, nor while a CUDA graph is
    captured (`debertakit.inference.graphs` checks its callers' inputs before copying them into the graph's)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids (B, N) and inputs_embeds (B, N, E)")
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length); got shape {tuple(input_ids.shape)}")
        if input_ids.dtype.is_floating_point:
            raise ValueError(f"input_ids must be integer token ids; got dtype {input_ids.dtype}")
        shape, device = tuple(input_ids.shape), input_ids.device
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != cfg.embedding_dim:
            raise ValueError(
                f"inputs_embeds must be (batch, length, {cfg.embedding_dim}); got {tuple(inputs_embeds.shape)}"
            )
        shape, device = tuple(inputs_embeds.shape[:2]), inputs_embeds.device
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(
            f"empty batch: inputs have shape {shape}; expected at least one sequence of one token"
        )
    read_values = not (torch.compiler.is_compiling() or capturing_cuda_graph())
    if input_ids is not None and read_values:
        _check_range("token id", input_ids, 0, cfg.vocab_size, "vocab_size")
    if token_type_ids is not None:
        if tuple(token_type_ids.shape) != shape:
            raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)}; expected {shape}")
        if cfg.type_vocab_size > 0 and read_values:
            _check_range("token type id", token_type_ids, 0, cfg.type_vocab_size, "type_vocab_size")
    if position_ids is not None:
        if (
            position_ids.dim() != 2
            or position_ids.shape[-1] != shape[1]
            or position_ids.shape[0] not in (1, shape[0])
        ):
            raise ValueError(
                f"position_ids has shape {tuple(position_ids.shape)}; expected {shape} or (1, {shape[1]})"
            )
        if cfg.position_biased_input and read_values:
            _check_range(
                "position id", position_ids, 0, cfg.max_position_embeddings, "max_position_embeddings"
            )
    elif cfg.position_biased_input and shape[1] > cfg.max_position_embeddings:
        raise ValueError(
            f"input length {shape[1]} exceeds max_position_embeddings={cfg.max_position_embeddings} of a model "
            f"with absolute positions at the input"
        )
    if attention_mask is not None:
        _check_mask(attention_mask, shape, cfg.num_heads)
    return shape, device


def _check_range(what: str, t: Tensor, lo: int, hi: int, name: str) -> None:
    bad = (t < lo) | (t >= hi)
    if bool(bad.any()):
        b, p = (int(i) for i in bad.nonzero()[0])
        value = int(t[b, p])
        expected = f">= {name} {hi}" if value >= hi else f"< {lo}"
        raise ValueError(f"{what} {value} {expected} at batch {b}, position {p}")


def _check_mask(mask: Tensor, shape: tuple[int, int], n_heads: int) -> None:
    b, n = shape
    ok = {
        2: tuple(mask.shape) == (b, n),
        3: tuple(mask.shape) == (b, n, n),
        4: mask.dim() == 4
        and mask.shape[0] == b
        and mask.shape[1] in (1, n_heads)
        and tuple(mask.shape[2:]) == (n, n),
    }.get(mask.dim(), False)
    if not ok:
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)}; expected ({b}, {n}), ({b}, {n}, {n}) or "
            f"({b}, 1 or {n_heads}, {n}, {n}) for inputs of shape {shape}"
        )


@torch.no_grad()
def init_weights(module: nn.Module, cfg: DebertaConfig) -> None:
    """Normal(0, initializer_range) for weights, zeros for biases, ones/zeros for LayerNorm (as released)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d)):
            m.weight.normal_(0.0, cfg.initializer_range)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.Embedding):
            m.weight.normal_(0.0, cfg.initializer_range)
            if m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()
