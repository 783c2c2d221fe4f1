"""Replaced-token detection with a generator (DeBERTa-v3; REFERENCE.md §1–2).

One step:

1. the generator (an MLM, same width and half the depth by default) predicts the [MASK]ed positions; its loss
   is the MLM loss on those positions;
2. every selected position gets a token sampled from the generator's softmax (torch.multinomial, temperature
   1, no gradient); a sampled token equal to the original counts as original;
3. the discriminator labels every real token "original" (0) or "replaced" (1); its loss is the binary
   cross-entropy over real tokens, weighted by λ (``rtd_weight``: 10 in the official recipe, ELECTRA used 50).

Embedding sharing (``sharing``):

* ``"gdes"`` (gradient-disentangled): the discriminator's word embedding is
  stop_gradient(E_generator) + E_Δ with E_Δ initialised to zero, so RTD gradients reach E_Δ only and the
  generator's embedding learns from MLM alone;
* ``"es"``: one embedding for both (RTD and MLM gradients both reach it, the ELECTRA way);
* ``"none"``: separate embeddings.

`export()` gives the two Hugging Face-loadable models; with GDES the discriminator's saved embedding is
E_generator + E_Δ.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from debertakit.config import DebertaConfig
from debertakit.model.tasks import DebertaForMaskedLM, DebertaForReplacedTokenDetection
from debertakit.objectives.losses import IGNORE_INDEX
from debertakit.objectives.mlm import model_inputs

Sharing = Literal["gdes", "es", "none"]


def generator_config(cfg: DebertaConfig, num_layers: int | None = None, **overrides) -> DebertaConfig:
    """The generator's configuration: the discriminator's, with half the layers unless told otherwise.

    A generator of another width keeps the discriminator's embedding size (through ``embedding_size`` and
    the embedding projection) so that the embedding can be shared.
    """
    layers = max(1, cfg.num_layers // 2) if num_layers is None else num_layers
    gen = cfg.replace(num_layers=layers, **overrides)
    if gen.embedding_dim != cfg.embedding_dim:
        gen = gen.replace(embedding_size=cfg.embedding_dim)
    return gen


def sample_replacements(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """(M, V) generator logits -> (M,) tokens sampled from the softmax at temperature 1."""
    probs = torch.softmax(logits.detach().float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def replaced_inputs(
    original: Tensor, select: Tensor, sampled: Tensor, token_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """The discriminator's input and labels.

    Args:
        original: (B, N) the unmasked tokens.
        select: (B, N) bool, the positions the generator filled (row-major order of ``sampled``).
        sampled: (M,) the generator's samples.
        token_mask: (B, N) bool, real (non-padding) tokens.

    Returns:
        (B, N) input ids and (B, N) labels: 1 replaced, 0 original (a sample equal to the original counts as
        original), -100 at padding.
    """
    ids = original.clone()
    ids[select] = sampled
    labels = (ids != original).long()
    return ids, labels.masked_fill(~token_mask, IGNORE_INDEX)


class ReplacedTokenDetectionObjective(nn.Module):
    """Generator + discriminator. ``forward(batch)`` returns the losses and metrics of one step."""

    kind = "rtd"

    def __init__(
        self,
        generator: DebertaForMaskedLM,
        discriminator: DebertaForReplacedTokenDetection,
        sharing: Sharing = "gdes",
        rtd_weight: float = 10.0,
    ):
        super().__init__()
        if sharing not in ("gdes", "es", "none"):
            raise ValueError(f"sharing={sharing!r}; expected 'gdes', 'es' or 'none'")
        if rtd_weight <= 0:
            raise ValueError(f"rtd_weight={rtd_weight} must be > 0")
        g_emb, d_emb = generator.deberta.embeddings.word, discriminator.deberta.embeddings.word
        if sharing != "none" and g_emb.weight.shape != d_emb.weight.shape:
            raise ValueError(
                f"embedding sharing {sharing!r} needs equal word embeddings; generator "
                f"{tuple(g_emb.weight.shape)} vs discriminator {tuple(d_emb.weight.shape)}"
            )
        self.generator, self.discriminator = generator, discriminator
        self.sharing, self.rtd_weight = sharing, rtd_weight
        self.embedding_delta = None
        if sharing == "es":
            discriminator.deberta.embeddings.word = g_emb  # one module: both losses reach it
        elif sharing == "gdes":
            self.embedding_delta = nn.Parameter(torch.zeros_like(g_emb.weight))  # E_Δ = 0 at start
            d_emb.weight.requires_grad_(False)  # unused while training; written at export

    # ------------------------------------------------------------------ one step
    def discriminator_embeddings(self, ids: Tensor) -> Tensor | None:
        """GDES: (B, N, E) = embedding of ids in stop_gradient(E_generator) + E_Δ; None otherwise."""
        if self.embedding_delta is None:
            return None
        table = self.generator.deberta.embeddings.word.weight.detach() + self.embedding_delta
        return F.embedding(ids, table)

    def discriminator_logits(self, ids: Tensor, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        """(B, N) logits and the backbone's token mask. In a packed row every token adds the state of its own
        segment's [CLS] (the RTD head adds the first token's state)."""
        embeds = self.discriminator_embeddings(ids)
        kw = {"inputs_embeds": embeds} if embeds is not None else {"input_ids": ids}
        out = self.discriminator.deberta(**kw, **inputs)
        h = out.last_hidden_state  # (B, N, H)
        head = self.discriminator.rtd_head
        if "cu_seqlens" not in inputs:
            return head(h), out.context.token_mask
        cu = inputs["cu_seqlens"].long()
        seg = torch.bucketize(torch.arange(h.shape[1], device=h.device), cu[1:], right=True)
        cls_state = h[:, cu[:-1][seg.clamp(max=cu.numel() - 2)]]  # (1, T, H)
        logits = head.classifier(head.act(head.dense(head.norm(h + cls_state)))).squeeze(-1)
        return logits, out.context.token_mask

    def forward(
        self, batch: dict[str, Tensor], generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        inputs = model_inputs(batch)
        labels, original = batch["labels"], batch["original_ids"]
        select = labels != IGNORE_INDEX  # (B, N)
        gen = self.generator(input_ids=batch["input_ids"], labels=labels, **inputs)  # logits (M, V)
        sampled = sample_replacements(gen.logits, generator)
        token_mask = self._token_mask(batch, original)
        ids, rtd_labels = replaced_inputs(original, select, sampled, token_mask)
        logits, _ = self.discriminator_logits(ids, inputs)
        keep = rtd_labels != IGNORE_INDEX
        rtd_loss = F.binary_cross_entropy_with_logits(logits[keep].float(), rtd_labels[keep].float())
        with torch.no_grad():
            n_targets = select.sum()
            gen_acc = (gen.logits.argmax(-1) == gen.labels).float().sum() / n_targets.clamp(min=1)
            rtd_acc = ((logits[keep] > 0).long() == rtd_labels[keep]).float().mean()
        return {
            "loss": gen.loss + self.rtd_weight * rtd_loss,
            "mlm_loss": gen.loss.detach(),
            "mlm_accuracy": gen_acc,
            "rtd_loss": rtd_loss.detach(),
            "rtd_accuracy": rtd_acc,
            "replaced_fraction": rtd_labels[keep].float().mean(),
            "mlm_targets": n_targets,
            "rtd_logits": logits[keep].detach(),
            "rtd_labels": rtd_labels[keep],
        }

    @staticmethod
    def _token_mask(batch: dict[str, Tensor], original: Tensor) -> Tensor:
        if "attention_mask" in batch:
            return batch["attention_mask"].bool()
        if "cu_seqlens" in batch:
            t = torch.arange(original.shape[1], device=original.device)
            return (t < batch["cu_seqlens"][-1])[None]
        return torch.ones_like(original, dtype=torch.bool)

    # ------------------------------------------------------------------ optimisation and export
    def parameter_groups(self) -> list[list[nn.Parameter]]:
        """[generator parameters, discriminator parameters (+ E_Δ)]: one optimizer each when decoupled.
        A shared embedding (``es``) belongs to the generator's group."""
        gen = list(self.generator.parameters())
        seen = {id(p) for p in gen}
        disc = [p for p in self.discriminator.parameters() if id(p) not in seen and p.requires_grad]
        if self.embedding_delta is not None:
            disc.append(self.embedding_delta)
        return [gen, disc]

    @torch.no_grad()
    def export(self) -> dict[str, nn.Module]:
        """Generator and discriminator as stand-alone models; the discriminator's embedding is the one it
        used (generator's + E_Δ with GDES, the generator's with plain sharing)."""
        disc = copy.deepcopy(self.discriminator)
        if self.sharing != "none":
            word = copy.deepcopy(self.generator.deberta.embeddings.word)
            if self.embedding_delta is not None:
                word.weight.add_(self.embedding_delta)
            word.weight.requires_grad_(True)
            disc.deberta.embeddings.word = word
        return {"generator": self.generator, "discriminator": disc}
