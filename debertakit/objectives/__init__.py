"""Losses and training objectives."""

from debertakit.objectives.losses import (
    IGNORE_INDEX,
    masked_lm_loss,
    replaced_token_loss,
    sequence_loss,
    span_loss,
    token_loss,
)

__all__ = [
    "IGNORE_INDEX",
    "masked_lm_loss",
    "replaced_token_loss",
    "sequence_loss",
    "span_loss",
    "token_loss",
]
