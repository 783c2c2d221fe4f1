"""Pictures: attention maps with their c2c / c2p / p2c score components, training curves."""

from debertakit.viz.attention import draw_attention_maps, pattern_stats
from debertakit.viz.components import LayerScores, layer_scores

__all__ = ["LayerScores", "draw_attention_maps", "layer_scores", "pattern_stats"]
