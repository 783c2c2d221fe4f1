"""Experiments that reproduce the paper's claims at small scale: ablation variants and their runner."""

from debertakit.experiments.variants import TABLE4, VARIANTS, Variant, get_variant, variant_config

__all__ = ["TABLE4", "VARIANTS", "Variant", "get_variant", "variant_config"]
