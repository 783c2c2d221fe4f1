"""Pictures: attention maps with their c2c / c2p / p2c score components, training curves."""

from debertakit.viz.components import LayerScores, layer_scores

__all__ = ["LayerScores", "layer_scores"]
